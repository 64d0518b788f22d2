"""L8: prioritised replay (sum tree, IS weights, max-priority insertion) and n-step transitions."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent.build import make_replay
from jaxdqn.agent.nstep import Transition, make_nstep_accumulator, nstep_targets
from jaxdqn.agent.replay import make_prioritised_replay, tree_search
from jaxdqn.config import ConfigError, ReplayConfig

ITEM = {"x": jax.ShapeDtypeStruct((2,), jnp.float32), "a": jax.ShapeDtypeStruct((), jnp.int32)}


def _items(values) -> dict:
    values = np.asarray(values, np.float32)
    return {"x": np.stack([values, -values], axis=-1), "a": values.astype(np.int32)}


def _filled(capacity, priorities, *, alpha=1.0, fanout=2, eps=1e-6):
    replay = make_prioritised_replay(capacity, ITEM, alpha=alpha, fanout=fanout, eps=eps)
    priorities = np.asarray(priorities, np.float32)
    state = replay.add(replay.init(), _items(np.arange(len(priorities))), priorities)
    return replay, state


def _draw(replay, state, key, batch_size, num_batches, beta=0.0):
    keys = jax.random.split(key, num_batches)
    sample = jax.jit(jax.vmap(replay.sample, in_axes=(None, 0, None, None)), static_argnums=2)
    return sample(state, keys, batch_size, beta)


@pytest.mark.parametrize("fanout", [2, 4])
def test_l8_sampling_frequencies_follow_priorities_to_the_alpha(fanout):
    alpha = 0.7
    q = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 0.5, 9.0])
    replay, state = _filled(16, q, alpha=alpha, fanout=fanout)
    batch = _draw(replay, state, jax.random.PRNGKey(0), 64, 400)
    counts = np.bincount(np.asarray(batch.indices).ravel(), minlength=16)
    draws = counts.sum()
    assert counts[len(q) :].sum() == 0
    expected = q**alpha / np.sum(q**alpha) * draws
    chi2 = np.sum((counts[: len(q)] - expected) ** 2 / expected)
    # 9 degrees of freedom: the 0.999 quantile is 27.9. Stratified draws only lower chi2.
    assert chi2 < 27.9, chi2
    uniform = np.full(len(q), draws / len(q))
    chi2_uniform = np.sum((counts[: len(q)] - uniform) ** 2 / uniform)
    assert chi2_uniform > 500.0, chi2_uniform
    # The items come from the sampled slots.
    np.testing.assert_array_equal(np.asarray(batch.items["a"]), np.asarray(batch.indices))


@pytest.mark.slow
def test_l8_empty_and_invalid_slots_are_never_sampled():
    replay = make_prioritised_replay(100, ITEM, alpha=0.6)  # padded to 128 leaves
    state = replay.add(replay.init(), _items([0, 1, 2, 3, 4]), jnp.ones(5))
    state = replay.add(
        state,
        _items([5, 6, 7]),
        jnp.full(3, 50.0),
        valid=jnp.array([True, False, True]),
    )
    assert int(state.size) == 8
    batch = _draw(replay, state, jax.random.PRNGKey(1), 256, 50)
    seen = np.unique(np.asarray(batch.indices))
    assert set(seen.tolist()) <= {0, 1, 2, 3, 4, 5, 7}
    assert {5, 7} <= set(seen.tolist())
    # Targets on or past the total mass (float rounding) still land on a positive leaf.
    total = state.tree[0][0]
    targets = jnp.array([total, jnp.nextafter(total, jnp.inf), 2.0 * total, 0.0])
    found = np.asarray(tree_search(state.tree, targets))
    assert (np.asarray(state.tree[-1])[found] > 0).all()
    np.testing.assert_array_equal(found[:3], [7, 7, 7])
    np.testing.assert_array_equal(found[3], 0)


@pytest.mark.slow
def test_l8_importance_weights_against_hand_computation():
    # q = (1, 4), α = 1: P = (0.2, 0.8), N = 2. With β = 0.5 a batch holding both slots has
    # w_0 = (2·0.2)^-0.5 / (2·0.2)^-0.5 = 1 and w_1 = (2·0.8)^-0.5 / (2·0.2)^-0.5 = 0.5.
    replay, state = _filled(4, [1.0, 4.0])
    for seed in range(20):
        batch = replay.sample(state, jax.random.PRNGKey(seed), 2, jnp.float32(0.5))
        indices = np.asarray(batch.indices)
        if set(indices.tolist()) == {0, 1}:
            np.testing.assert_allclose(np.asarray(batch.is_weights)[indices], [1.0, 0.5])
            break
    else:
        pytest.fail("no batch held both slots")
    # General case: w_i = (N·P(i))^-β / max_j (N·P(j))^-β over the batch.
    alpha, beta = 0.6, 0.4
    q = np.array([0.3, 1.0, 2.5, 4.0, 7.0, 0.1])
    replay, state = _filled(8, q, alpha=alpha)
    batch = replay.sample(state, jax.random.PRNGKey(3), 32, beta)
    p = q**alpha / np.sum(q**alpha)
    raw = (len(q) * p[np.asarray(batch.indices)]) ** -beta
    np.testing.assert_allclose(np.asarray(batch.is_weights), raw / raw.max(), rtol=1e-5)
    assert np.asarray(batch.is_weights).max() == 1.0
    # β = 0: no correction.
    batch = replay.sample(state, jax.random.PRNGKey(3), 32, 0.0)
    np.testing.assert_array_equal(np.asarray(batch.is_weights), 1.0)


def test_l8_max_priority_insertion_scaled_by_selectivity():
    alpha = 0.5
    replay, state = _filled(8, [1.0, 1.0], alpha=alpha)
    assert float(replay.max_priority(state)) == 1.0
    state = replay.set_priorities(state, jnp.array([0, 1]), jnp.array([5.0, 2.0]))
    assert float(replay.max_priority(state)) == 5.0
    selectivity = jnp.array([0.5, 0.2, 1.0])
    state = jax.jit(replay.add_scaled)(state, _items([2, 3, 4]), selectivity)
    leaves = np.asarray(state.tree[-1])
    np.testing.assert_allclose(leaves[2:5], np.array([2.5, 1.0, 5.0]) ** alpha, rtol=1e-6)
    assert float(replay.max_priority(state)) == 5.0
    # An explicit priority above the running max raises it; the max never decreases.
    state = replay.add(state, _items([5]), jnp.array([9.0]))
    state = replay.set_priorities(state, jnp.array([5]), jnp.array([0.1]))
    assert float(replay.max_priority(state)) == 9.0


def test_l8_set_priorities_duplicates_take_the_max_and_ignore_unwritten_slots():
    alpha = 0.5
    replay, state = _filled(8, [1.0, 1.0, 1.0], alpha=alpha)
    indices = jnp.array([1, 1, 2, 1, 6])
    priorities = jnp.array([3.0, 7.0, 2.0, 5.0, 100.0])
    for fn in (replay.set_priorities, jax.jit(replay.set_priorities)):
        new = fn(state, indices, priorities)
        leaves = np.asarray(new.tree[-1])
        np.testing.assert_allclose(leaves[:3], np.array([1.0, 7.0, 2.0]) ** alpha, rtol=1e-6)
        assert leaves[6] == 0.0  # slot 6 was never written: ignored
        assert float(new.max_priority) == 7.0
    # Order of the duplicates does not matter.
    new = replay.set_priorities(state, indices[::-1], priorities[::-1])
    np.testing.assert_allclose(np.asarray(new.tree[-1])[1], 7.0**alpha, rtol=1e-6)
    # Priorities are floored at eps.
    new = replay.set_priorities(state, jnp.array([0]), jnp.array([0.0]))
    assert float(new.tree[-1][0]) == pytest.approx(1e-6**alpha)


def test_l8_ring_wraps_around():
    replay = make_prioritised_replay(5, ITEM, alpha=1.0)
    state = replay.add(replay.init(), _items([0, 1, 2]), jnp.array([1.0, 2.0, 3.0]))
    assert (int(state.position), int(state.size)) == (3, 3)
    state = replay.add(state, _items([3, 4, 5, 6]), jnp.array([4.0, 5.0, 6.0, 7.0]))
    assert (int(state.position), int(state.size)) == (2, 5)
    np.testing.assert_array_equal(np.asarray(state.storage["a"]), [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(np.asarray(state.storage["x"])[:, 1], [-5, -6, -2, -3, -4])
    leaves = np.asarray(state.tree[-1])
    np.testing.assert_allclose(leaves[:5], [6, 7, 3, 4, 5])
    assert not leaves[5:].any()
    assert float(state.tree[0][0]) == 25.0
    with pytest.raises(ConfigError, match="exceed the capacity"):
        replay.add(state, _items(np.arange(6)), jnp.ones(6))


@pytest.mark.slow
@pytest.mark.parametrize("fanout", [2, 8])
def test_l8_sum_tree_root_equals_sum_of_leaves_after_many_updates(fanout):
    capacity, num_add, batch = 1000, 37, 64
    replay = make_prioritised_replay(capacity, ITEM, alpha=0.6, fanout=fanout)

    def step(state, key):
        k_add, k_sample, k_prio = jax.random.split(key, 3)
        new = jax.random.uniform(k_add, (num_add,), minval=0.0, maxval=3.0)
        state = replay.add(state, _items_jnp(num_add), new)
        sample = replay.sample(state, k_sample, batch, 0.5)
        loss = jax.random.exponential(k_prio, (batch,)) * 10.0
        return replay.set_priorities(state, sample.indices, loss), None

    state, _ = jax.jit(lambda s, k: jax.lax.scan(step, s, k))(
        replay.init(), jax.random.split(jax.random.PRNGKey(7), 300)
    )
    leaves = np.asarray(state.tree[-1], np.float64)
    assert int(state.size) == capacity
    assert (leaves[:capacity] > 0).all() and (leaves[capacity:] == 0).all()
    assert float(state.tree[0][0]) == pytest.approx(leaves.sum(), rel=1e-5)
    for level in state.tree[:-1]:
        width = level.shape[0]
        np.testing.assert_allclose(
            np.asarray(level), leaves.reshape(width, -1).sum(axis=1), rtol=1e-5
        )


def _items_jnp(num: int) -> dict:
    return {"x": jnp.ones((num, 2)), "a": jnp.arange(num, dtype=jnp.int32)}


@pytest.mark.slow
@pytest.mark.parametrize("fanout", [2, 4, 8])
def test_l8_tree_sampler_equals_cumsum_searchsorted_reference(fanout):
    rng = np.random.default_rng(0)
    capacity = 300
    # Integer masses: every partial sum is exact, so both searches must agree exactly.
    q = rng.integers(1, 20, size=capacity).astype(np.float32)
    q[rng.choice(capacity, 40, replace=False)] = 0.0  # invalid items: zero leaves
    replay = make_prioritised_replay(capacity, ITEM, alpha=1.0, fanout=fanout)
    state = replay.add(replay.init(), _items_jnp(capacity), jnp.asarray(q), valid=q > 0)
    leaves = np.asarray(state.tree[-1])
    total = leaves.sum()
    targets = np.concatenate([rng.integers(0, int(total), 2000), rng.uniform(0, total, 2000)])
    found = np.asarray(jax.jit(tree_search)(state.tree, jnp.asarray(targets, jnp.float32)))
    reference = np.searchsorted(np.cumsum(leaves), targets, side="right")
    np.testing.assert_array_equal(found, reference)
    assert (leaves[found] > 0).all()
    # Real-valued masses: partial sums round differently; agreement everywhere but at
    # boundaries, and the tree never returns a zero leaf.
    state = replay.add(
        replay.init(),
        _items_jnp(capacity),
        jnp.asarray(rng.exponential(size=capacity), jnp.float32),
        valid=q > 0,
    )
    leaves = np.asarray(state.tree[-1], np.float64)
    targets = rng.uniform(0, float(state.tree[0][0]), 20000)
    found = np.asarray(tree_search(state.tree, jnp.asarray(targets, jnp.float32)))
    reference = np.searchsorted(np.cumsum(leaves), targets, side="right")
    assert np.mean(found == reference) > 0.999
    assert (leaves[found] > 0).all()


@pytest.mark.slow
def test_l8_replay_vmaps_over_a_leading_seed_axis():
    replay = make_prioritised_replay(64, ITEM, alpha=0.6)
    seeds = 3

    @functools.partial(jax.jit, static_argnums=2)
    def run(key, priorities, batch_size):
        state = replay.add(replay.init(), _items_jnp(10), priorities)
        sample = replay.sample(state, key, batch_size, 0.4)
        state = replay.set_priorities(state, sample.indices, sample.is_weights + 1.0)
        return sample, state

    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    priorities = jax.random.uniform(jax.random.PRNGKey(1), (seeds, 10)) + 0.1
    batched = jax.vmap(run, in_axes=(0, 0, None))(keys, priorities, 16)
    assert batched[0].indices.shape == (seeds, 16)
    for s in range(seeds):
        single = run(keys[s], priorities[s], 16)
        np.testing.assert_array_equal(batched[0].indices[s], single[0].indices)
        np.testing.assert_allclose(batched[1].tree[-1][s], single[1].tree[-1], rtol=1e-6)
    assert not np.array_equal(batched[0].indices[0], batched[0].indices[1])


def test_l8_nstep_returns_with_gamma_to_the_n_and_episode_ends():
    g = 0.9
    # Two environments, five steps; env 0 ends its episode after r_1, env 1 never.
    rewards = jnp.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
    dones = jnp.array([[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]], bool)
    returns, discounts, offsets = nstep_targets(rewards, dones, g, 3)
    expected_returns = np.array(
        [
            [1 + g * 2, 10 + g * 20 + g**2 * 30],  # env 0 stops at the end after r_1
            [2.0, 20 + g * 30 + g**2 * 40],  # r_1 ends the episode: one step only
            [3 + g * 4 + g**2 * 5, 30 + g * 40 + g**2 * 50],
        ]
    )
    np.testing.assert_allclose(np.asarray(returns), expected_returns, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(discounts), [[0, g**3], [0, g**3], [g**3, g**3]], rtol=1e-6
    )
    np.testing.assert_array_equal(np.asarray(offsets), [[2, 3], [1, 3], [3, 3]])
    # n = 1 is the one-step target with discount γ.
    returns, discounts, offsets = nstep_targets(rewards, dones, g, 1)
    np.testing.assert_allclose(np.asarray(returns), np.asarray(rewards))
    np.testing.assert_allclose(np.asarray(discounts)[:, 0], [g, 0, g, g, g], rtol=1e-6)


def test_l8_nstep_accumulator_carries_the_tail_across_rollouts():
    n, g, steps, envs = 3, 0.8, 4, 2
    acc = make_nstep_accumulator(n, g)
    rng = np.random.default_rng(0)
    total = 3 * steps
    obs = rng.normal(size=(total + 1, envs, 2)).astype(np.float32)  # o_0 … o_12
    action = rng.integers(0, 3, size=(total, envs, 4)).astype(np.int32)
    reward = rng.normal(size=(total, envs)).astype(np.float32)
    done = rng.random(size=(total, envs)) < 0.25
    sel = rng.random(size=(total, envs)).astype(np.float32)  # M12 prediction at o_t
    state = acc.init(jnp.asarray(obs[0]), jnp.asarray(action[0]))
    update = jax.jit(acc.update)
    outs = []
    for r in range(3):
        sl = slice(r * steps, (r + 1) * steps)
        state, trans, valid = update(
            state, obs[sl], action[sl], reward[sl], done[sl], obs[(r + 1) * steps], sel[sl]
        )
        outs.append((trans, np.asarray(valid)))
    # Rollout r yields the transitions starting at steps r·K - (n-1) … (r+1)·K - n.
    assert not outs[0][1][: n - 1].any() and outs[0][1][n - 1 :].all()
    assert outs[1][1].all() and outs[2][1].all()
    starts = np.concatenate(
        [np.arange(r * steps - (n - 1), (r + 1) * steps - (n - 1)) for r in range(3)]
    )
    trans = jax.tree.map(lambda *x: np.concatenate(x), *[o[0] for o in outs])
    for i, t in enumerate(starts):
        if t < 0:
            continue
        for e in range(envs):
            ret, k = 0.0, 0
            while k < n and t + k < total:
                ret += g**k * reward[t + k, e]
                k += 1
                if done[t + k - 1, e]:
                    break
            ended = done[t : t + k, e].any()
            assert trans.reward[i, e] == pytest.approx(ret, rel=1e-5, abs=1e-6)
            assert trans.discount[i, e] == pytest.approx(0.0 if ended else g**n)
            np.testing.assert_array_equal(trans.obs[i, e], obs[t, e])
            np.testing.assert_array_equal(trans.action[i, e], action[t, e])
            np.testing.assert_array_equal(trans.next_obs[i, e], obs[t + k, e])
            # the selectivity rides with o_t unchanged (it scales the insertion priority)
            assert trans.selectivity[i, e] == sel[t, e]
    # Without a selectivity argument the transitions carry ones.
    _, plain, _ = update(
        acc.init(jnp.asarray(obs[0]), jnp.asarray(action[0])),
        obs[:steps],
        action[:steps],
        reward[:steps],
        done[:steps],
        obs[steps],
    )
    np.testing.assert_array_equal(np.asarray(plain.selectivity)[n - 1 :], 1.0)


def test_l8_agent_replay_items_are_transitions_with_int_actions_and_selectivity():
    """The agent's replay stores n-step :class:`Transition` items: ``action`` int32 ``[4]`` (one
    choice per branch) and the M12 ``selectivity`` in its own float32 field."""
    obs_dim, k, e = 5, 3, 2
    replay = make_replay(
        ReplayConfig(capacity=16, learning_starts=4, batch_size=4), obs_dim, alpha=0.6
    )
    state = replay.init()
    assert isinstance(state.storage, Transition)
    assert state.storage.action.shape == (16, 4) and state.storage.action.dtype == jnp.int32
    assert state.storage.selectivity.shape == (16,)
    assert state.storage.selectivity.dtype == jnp.float32
    rng = np.random.default_rng(1)
    choice = rng.integers(0, 3, size=(k * e, 4)).astype(np.int32)
    sel = np.array([0.5, 0.25, 1.0, 0.75, 0.1, 0.9], np.float32)
    items = Transition(
        obs=jnp.ones((k * e, obs_dim)),
        action=jnp.asarray(choice),
        reward=jnp.arange(k * e, dtype=jnp.float32),
        discount=jnp.full((k * e,), 0.9),
        next_obs=jnp.zeros((k * e, obs_dim)),
        selectivity=jnp.asarray(sel),
    )
    state = jax.jit(replay.add_scaled)(state, items, items.selectivity)
    np.testing.assert_array_equal(np.asarray(state.storage.action[: k * e]), choice)
    np.testing.assert_array_equal(np.asarray(state.storage.selectivity[: k * e]), sel)
    # default config: alpha 0.6, first insertion at max priority 1 scaled by the selectivity
    leaves = np.asarray(state.tree[-1])[: k * e]
    np.testing.assert_allclose(leaves, sel**replay.alpha, rtol=1e-6)
