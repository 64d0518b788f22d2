"""Training statistics (jaxdqn/agent/dynamics.py): the one owner of the support (L7), the EMAs
(L4, L5, the Q statistics O5 reads), the M13 state and M14 — against hand-computed values."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import dynamics as D
from jaxdqn.agent.liquid import LiquidInputs, make_liquid
from jaxdqn.agent.support import support_grid, target_half_width
from jaxdqn.config import DynamicsConfig, ModelConfig
from jaxdqn.model.xlstm import make_xlstm

N_ATOMS = 11
ALPHA = 0.1
CFG = DynamicsConfig(stats_alpha=ALPHA, support_alpha=0.05, support_half_width=0.1)
GAMMA_N = 0.9**3
XLSTM = make_xlstm(ModelConfig(xlstm_hidden=4))

# A batch of E[Q] [B=2, 4 branches, 3 actions] whose statistics are easy by hand.
Q = np.array(
    [
        [[0, 1, 2], [1, 1, 1], [0, 0, 3], [2, 0, 1]],
        [[2, 3, 4], [1, 1, 1], [3, 0, 0], [1, 1, 1]],
    ],
    np.float32,
)
# Per branch, over batch and actions: mean; mean over the batch of max − min; population std.
#   direction {0,1,2,2,3,4}: mean 2, gaps (2, 2), var 10/6
#   magnitude {1 × 6}:       mean 1, gaps (0, 0), var 0
#   order     {0,0,3,3,0,0}: mean 1, gaps (3, 3), var 12/6
#   urgency   {2,0,1,1,1,1}: mean 1, gaps (2, 0), var 2/6
STATS = np.array(
    [
        [2.0, 2.0, np.sqrt(10 / 6)],
        [1.0, 0.0, 0.0],
        [1.0, 3.0, np.sqrt(2.0)],
        [1.0, 1.0, np.sqrt(2 / 6)],
    ]
)
# Over all 24 values: mean 30/24, E[x²] = 66/24; gap mean over branches (2+0+3+1)/4.
Q_MEAN_ALL, Q_GAP_ALL = 1.25, 1.5
# The batch's scalar TD targets [B=2, 4] and n-step rewards [B]: over the 8 targets mean 3.5,
# population std 1.5 (squared deviations 2·(6.25 + 2.25 + 0.25 + 0.25) = 18 over 8); reward std 1.
TD = np.array([[1, 2, 3, 4], [3, 4, 5, 6]], np.float32)
TD_MEAN, TD_STD = 3.5, 1.5
REWARD = np.array([1.0, 3.0], np.float32)


def _dynamics(reward_unit=1.0, gap_cap=float("inf"), **changes):
    return D.make_dynamics(
        dataclasses.replace(CFG, **changes),
        num_atoms=N_ATOMS,
        gamma_n=GAMMA_N,
        reward_unit=reward_unit,
        gap_cap=gap_cap,
    )


def _init(dyn, readiness=0.0, kappa=1.0):
    return dyn.init(XLSTM.init_state(), readiness, kappa)


def _seen(utilisation=0.4, fill=7.0, context_norm=0.5, td=TD, reward=REWARD):
    """A batch observation with a recognisable xLSTM state and a context of the given norm."""
    xl = jax.tree.map(lambda x: jnp.full_like(x, fill), XLSTM.init_state())
    context = jnp.zeros((4,), jnp.float32).at[0].set(context_norm)
    return D.BatchObservation(
        q_mean=jnp.asarray(Q),
        td=jnp.asarray(td, jnp.float32),
        reward=jnp.asarray(reward, jnp.float32),
        utilisation=jnp.float32(utilisation),
        xlstm=xl,
        context=context,
    )


# ---------------------------------------------------------------------------------------------
# observe_rollout: the reward-std EMA (L5's scale)
# ---------------------------------------------------------------------------------------------


def test_l5_observe_rollout_seeds_the_reward_std_then_moves_by_stats_alpha():
    dyn = _dynamics()
    state = _init(dyn)
    assert float(state.reward_std_ema) == 0.0
    observe = jax.jit(dyn.observe_rollout)
    every = jnp.ones((4,), bool)
    # std over the valid n-step rewards (population): {1, 3} → 1
    state = observe(state, jnp.array([1.0, 3.0, 1.0, 3.0]), every)
    np.testing.assert_allclose(state.reward_std_ema, 1.0, rtol=1e-6)  # seeded, not 0.1·1
    # {0, 4} → std 2: 1 + 0.1·(2 − 1) = 1.1
    state = observe(state, jnp.array([0.0, 4.0, 4.0, 0.0]), every)
    np.testing.assert_allclose(state.reward_std_ema, 1.1, rtol=1e-6)
    # constant rewards → std 0: 1.1 + 0.1·(0 − 1.1) = 0.99
    state = observe(state, jnp.full((4,), 5.0), every)
    np.testing.assert_allclose(state.reward_std_ema, 0.99, rtol=1e-6)
    # only the reward-std EMA is written
    fresh = _init(dyn)
    for name in ("utilisation_ema", "q_mean", "q_gap", "q_std", "last_stats", "eval_q_std_ema"):
        np.testing.assert_array_equal(getattr(state, name), getattr(fresh, name), err_msg=name)


def test_l5_observe_rollout_counts_only_the_valid_slots():
    dyn = _dynamics()
    observe = jax.jit(dyn.observe_rollout)
    state = observe(_init(dyn), jnp.array([1.0, 3.0, 1.0, 3.0]), jnp.ones((4,), bool))
    # the invalid slots' (garbage) rewards are ignored: std{0, 4} = 2 → 1 + 0.1·(2 − 1)
    valid = jnp.array([True, True, False, False])
    new = observe(state, jnp.array([0.0, 4.0, 100.0, -50.0]), valid)
    np.testing.assert_allclose(new.reward_std_ema, 1.1, rtol=1e-6)
    # fewer than two valid slots (the first n − 1 steps of a run): nothing observed
    for valid in ([True, False, False, False], [False] * 4):
        same = observe(state, jnp.array([0.0, 4.0, 100.0, -50.0]), jnp.array(valid))
        np.testing.assert_array_equal(same.reward_std_ema, state.reward_std_ema)
    empty = observe(_init(dyn), jnp.array([0.0, 4.0, 1.0, 1.0]), jnp.zeros((4,), bool))
    assert float(empty.reward_std_ema) == 0.0


def test_l5_observe_rollout_waits_for_a_nonzero_std_to_seed():
    dyn = _dynamics()
    every = jnp.ones((4,), bool)
    state = dyn.observe_rollout(_init(dyn), jnp.zeros((4,)), every)  # first rollout: no trades
    assert float(state.reward_std_ema) == 0.0
    state = dyn.observe_rollout(state, jnp.array([-2.0, 2.0, -2.0, 2.0]), every)
    np.testing.assert_allclose(state.reward_std_ema, 2.0, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# observe_batch: the Q and utilisation EMAs, L7, M13, M14
# ---------------------------------------------------------------------------------------------


def test_l4_observe_batch_moves_the_emas_by_stats_alpha_toward_the_batch_statistics():
    dyn = _dynamics()
    state = _init(dyn)
    observe = jax.jit(dyn.observe_batch)
    new, metrics = observe(state, _seen(utilisation=0.4))
    # utilisation starts at 1 (all atoms in use): 1 + 0.1·(0.4 − 1) = 0.94
    np.testing.assert_allclose(new.utilisation_ema, 0.94, rtol=1e-6)
    # Q EMAs start at 0: one step is α·stat
    np.testing.assert_allclose(new.q_mean, ALPHA * STATS[:, 0], rtol=1e-6)
    np.testing.assert_allclose(new.q_gap, ALPHA * STATS[:, 1], rtol=1e-6)
    np.testing.assert_allclose(new.q_std, ALPHA * STATS[:, 2], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(new.last_stats, STATS, rtol=1e-6, atol=1e-7)  # M13's next input
    for i, name in enumerate(("q_mean", "q_gap", "q_std")):
        np.testing.assert_allclose(metrics[name], STATS[:, i], rtol=1e-6, atol=1e-7)
    # a second identical batch: x ← x + α(s − x) = (2α − α²)·s
    new, _ = observe(new, _seen(utilisation=0.4))
    np.testing.assert_allclose(new.q_gap, (2 * ALPHA - ALPHA**2) * STATS[:, 1], rtol=1e-6)
    np.testing.assert_allclose(new.utilisation_ema, 0.94 + ALPHA * (0.4 - 0.94), rtol=1e-6)
    # host inputs and the reward-std EMA are not observe_batch's to write
    assert float(new.reward_std_ema) == 0.0 and float(new.eval_q_std_ema) == 0.0


@pytest.mark.parametrize("unit", [1.0, 0.25])
def test_l7_fixed_support_stays_fixed_when_adaptive_support_is_off(unit):
    dyn = _dynamics(reward_unit=unit, adaptive_support=False)
    state = _init(dyn)
    half = CFG.support_half_width * unit  # configured in reward units
    new, metrics = dyn.observe_batch(state, _seen())
    for a, b in zip(jax.tree.leaves(new.support), jax.tree.leaves(state.support), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(new.support.half_width, half, rtol=1e-6)
    assert float(new.support.centre) == 0.0
    np.testing.assert_allclose(metrics["support_half_width"], half, rtol=1e-6)
    # the grid is the support's: v_min = −half, Δz = 2·half/(N − 1)
    v_min, dz = dyn.grid(new)
    np.testing.assert_allclose(v_min, -half, rtol=1e-6)
    np.testing.assert_allclose(dz, 2 * half / (N_ATOMS - 1), rtol=1e-6)


def test_l7_adaptive_support_is_sized_from_the_batch_targets():
    dyn = _dynamics(adaptive_support=True)
    state = _init(dyn)
    observe = jax.jit(dyn.observe_batch)
    new, metrics = observe(state, _seen())
    # First observation (the TD-std EMA still 0): set directly, α = 1:
    #   centre = mean TD target 3.5; half = max(k·std(R_n)/sqrt(1 − γ²ⁿ), h_min), std(R_n) = 1
    half = max(CFG.support_sigmas * 1.0 / np.sqrt(1 - GAMMA_N**2), CFG.support_min_half_width)
    np.testing.assert_allclose(new.support.td_std_ema, TD_STD, rtol=1e-6)
    np.testing.assert_allclose(new.support.alpha, 1.0)
    np.testing.assert_allclose(new.support.centre, TD_MEAN, rtol=1e-6)
    np.testing.assert_allclose(new.support.half_width, half, rtol=1e-5)
    np.testing.assert_allclose(metrics["support_centre"], TD_MEAN, rtol=1e-6)
    np.testing.assert_allclose(metrics["support_half_width"], half, rtol=1e-5)
    v_min, dz = dyn.grid(new)
    expect = support_grid(new.support, N_ATOMS)
    np.testing.assert_allclose(v_min, expect[0])
    np.testing.assert_allclose(dz, expect[1])
    np.testing.assert_allclose(v_min, TD_MEAN - half, rtol=1e-5)
    # The Q statistics no longer size it: E[Q] 100× wider changes nothing.
    wide = _seen()._replace(q_mean=jnp.asarray(Q) * 100)
    np.testing.assert_allclose(observe(state, wide)[0].support.half_width, half, rtol=1e-5)
    # Then the base rate 0.05 toward the batch (a shift of 1 < 3·1.5 is normal) ...
    again, _ = observe(new, _seen(td=TD + 1.0, reward=2 * REWARD))
    np.testing.assert_allclose(again.support.alpha, 0.05, rtol=1e-6)
    np.testing.assert_allclose(again.support.centre, TD_MEAN + 0.05, rtol=1e-6)
    np.testing.assert_allclose(again.support.half_width, half + 0.05 * half, rtol=1e-5)
    # ... and the max rate 0.5 for an abnormal shift (10 ≥ 2·3·1.5)
    jump, _ = observe(new, _seen(td=TD + 10.0))
    np.testing.assert_allclose(jump.support.alpha, CFG.support_max_alpha, rtol=1e-6)
    np.testing.assert_allclose(jump.support.centre, TD_MEAN + 0.5 * 10, rtol=1e-6)


def test_l7_adaptive_support_minimum_is_in_reward_units():
    unit = 0.5
    dyn = _dynamics(reward_unit=unit, adaptive_support=True)
    state = _init(dyn)
    np.testing.assert_allclose(state.support.half_width, CFG.support_half_width * unit)
    # constant rewards (std 0): the half-width is its minimum h_min · unit
    new, _ = dyn.observe_batch(state, _seen(reward=np.ones(2, np.float32)))
    np.testing.assert_allclose(new.support.half_width, CFG.support_min_half_width * unit)
    np.testing.assert_allclose(
        target_half_width(0.0, GAMMA_N, CFG.support_sigmas, CFG.support_min_half_width * unit),
        new.support.half_width,
    )


def test_m13_observe_batch_writes_the_xlstm_state_from_the_observation():
    dyn = _dynamics()
    state = _init(dyn)
    new, _ = dyn.observe_batch(state, _seen(fill=7.0))
    for leaf in jax.tree.leaves(new.xlstm):
        np.testing.assert_array_equal(leaf, 7.0)
    for leaf in jax.tree.leaves(state.xlstm):  # the input state was zeros
        np.testing.assert_array_equal(leaf, 0.0)


@pytest.mark.parametrize("context_norm", [0.5, 2.0])
def test_m14_observe_batch_steps_liquid_with_the_batch_gap_and_context_norm(context_norm):
    dyn = _dynamics()
    state = _init(dyn)
    state = dyn.set_host_inputs(state, eval_q_std_ema=0.05)
    new, metrics = dyn.observe_batch(state, _seen(context_norm=context_norm))
    liquid = make_liquid(CFG)
    want, mod = liquid.step(
        liquid.init_state(),
        LiquidInputs(
            q_gap=jnp.asarray(STATS[:, 1], jnp.float32),
            eval_q_std_ema=jnp.float32(0.05),
            context_norm=jnp.float32(context_norm),
        ),
    )
    for a, b in zip(jax.tree.leaves(new.liquid), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(metrics["liquid_mod"], mod, rtol=1e-6)
    assert bool(new.liquid.used_rk4) is (context_norm > CFG.liquid_rk4_threshold)
    assert float(metrics["liquid_rk4"]) == float(context_norm > CFG.liquid_rk4_threshold)
    # target gap max(10·0.05, 0.05) = 0.5: the gap-0 branch is clipped at liquid_max, the gap-3
    # branch is amplified by 0.5/3 (the relaxation from mod = 1 leaves 1).
    np.testing.assert_allclose(mod[1], CFG.liquid_max)
    np.testing.assert_allclose(mod[2], 0.5 / 3.0, rtol=1e-6)


def test_m14_observe_batch_passes_the_reward_unit_and_gap_cap_to_liquid():
    unit, cap = 4.0, 0.8
    dyn = _dynamics(reward_unit=unit, gap_cap=cap)
    state = dyn.set_host_inputs(_init(dyn), eval_q_std_ema=0.5)
    _, metrics = dyn.observe_batch(state, _seen())
    liquid = make_liquid(CFG, reward_unit=unit, gap_cap=cap)
    inputs = LiquidInputs(
        q_gap=jnp.asarray(STATS[:, 1], jnp.float32),
        eval_q_std_ema=jnp.float32(0.5),
        context_norm=jnp.float32(0.5),
    )
    _, mod = liquid.step(liquid.init_state(), inputs)
    np.testing.assert_allclose(metrics["liquid_mod"], mod, rtol=1e-6)
    # target min(max(10·0.5, 0.05·4), 0.8) = 0.8: the gap-2 branch gets 0.4, gap 1 gets 0.8
    np.testing.assert_allclose(mod[0], 0.4, rtol=1e-6)
    np.testing.assert_allclose(mod[3], 0.8, rtol=1e-6)


def test_m14_liquid_off_keeps_the_mod_at_one():
    dyn = _dynamics(liquid=False)
    new, metrics = dyn.observe_batch(_init(dyn), _seen())
    np.testing.assert_array_equal(new.liquid.mod, 1.0)
    np.testing.assert_array_equal(metrics["liquid_mod"], 1.0)


# ---------------------------------------------------------------------------------------------
# set_host_inputs and the host-side validation-spread EMA
# ---------------------------------------------------------------------------------------------


def test_m14_set_host_inputs_keeps_shape_and_dtype_and_rejects_unknown_names():
    dyn = _dynamics()
    state = _init(dyn, readiness=0.25, kappa=0.75)
    np.testing.assert_allclose(state.iqn_readiness, 0.25)
    np.testing.assert_allclose(state.kappa, 0.75)
    assert state.kappa.shape == () and state.kappa.dtype == jnp.float32
    np.testing.assert_allclose(dyn.init(XLSTM.init_state(), 0.0).kappa, 1.0)  # the seed's κ
    traces = []

    @jax.jit
    def read(s):
        traces.append(1)
        return s.iqn_readiness + s.eval_q_std_ema + s.kappa

    read(state)
    for readiness, spread, kappa in ((0.5, 0.01, 0.25), (1, 2, 1)):  # Python floats and ints
        new = dyn.set_host_inputs(
            state, iqn_readiness=readiness, eval_q_std_ema=spread, kappa=kappa
        )
        for name, value in (
            ("iqn_readiness", readiness), ("eval_q_std_ema", spread), ("kappa", kappa)
        ):  # fmt: skip
            leaf = getattr(new, name)
            assert leaf.shape == () and leaf.dtype == jnp.float32, name
            assert not leaf.weak_type, name
            np.testing.assert_allclose(leaf, value)
        np.testing.assert_allclose(read(new), readiness + spread + kappa, rtol=1e-6)
    assert len(traces) == 1  # same avals: no retrace
    # only the named input changes
    only = dyn.set_host_inputs(state, eval_q_std_ema=0.3)
    np.testing.assert_allclose(only.iqn_readiness, 0.25)
    np.testing.assert_allclose(only.kappa, 0.75)
    with pytest.raises(TypeError, match="reward_std_ema"):
        dyn.set_host_inputs(state, reward_std_ema=1.0)
    with pytest.raises(TypeError, match="not host inputs"):
        dyn.set_host_inputs(state, iqn_readiness=0.5, support=0.0)


def test_m14_set_host_inputs_on_a_seed_population():
    dyn = _dynamics()
    states = jax.vmap(lambda r: dyn.init(XLSTM.init_state(), r, 1.0))(jnp.zeros((3,)))
    new = dyn.set_host_inputs(states, iqn_readiness=0.5, kappa=0.25, eval_q_std_ema=[0.1, 0.2, 0.3])
    assert new.iqn_readiness.shape == (3,) and new.iqn_readiness.dtype == jnp.float32
    assert new.kappa.shape == (3,) and new.kappa.dtype == jnp.float32
    np.testing.assert_allclose(new.iqn_readiness, 0.5)
    np.testing.assert_allclose(new.kappa, 0.25)
    np.testing.assert_allclose(new.eval_q_std_ema, [0.1, 0.2, 0.3], rtol=1e-6)


def test_m14_next_eval_q_std_seeds_with_the_first_spread_then_moves_by_its_alpha():
    dyn = _dynamics()
    assert CFG.eval_q_std_alpha == 0.3
    ema = dyn.next_eval_q_std(None, np.float32(0.5))
    assert ema == [0.5]
    ema = dyn.next_eval_q_std(ema, np.float32(1.5))  # 0.5 + 0.3·(1.5 − 0.5)
    np.testing.assert_allclose(ema, [0.8], rtol=1e-6)
    ema = dyn.next_eval_q_std(ema, np.float32(0.8))  # at the EMA: no move
    np.testing.assert_allclose(ema, [0.8], rtol=1e-6)
    # the rate is dynamics.eval_q_std_alpha
    other = _dynamics(eval_q_std_alpha=0.5)
    np.testing.assert_allclose(other.next_eval_q_std([1.0], np.float32(2.0)), [1.5], rtol=1e-6)
    # a population: one EMA per seed, seeded per seed
    spreads = np.array([0.2, 0.4], np.float32)
    pop = dyn.next_eval_q_std([], spreads)
    np.testing.assert_allclose(pop, spreads, rtol=1e-6)
    pop = dyn.next_eval_q_std(pop, np.array([1.2, 0.4], np.float32))
    np.testing.assert_allclose(pop, [0.2 + 0.3 * 1.0, 0.4], rtol=1e-6)
    assert all(isinstance(v, float) for v in pop)
    with pytest.raises(ValueError):  # one spread per seed
        dyn.next_eval_q_std(pop, np.float32(1.0))
