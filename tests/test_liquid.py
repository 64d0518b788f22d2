"""M14: liquid time constants — EMA, τ from velocity, Euler/RK4 relaxation, spread amplifier."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn import config as C
from jaxdqn.agent import liquid as L
from jaxdqn.config import ConfigError, DynamicsConfig

CFG = DynamicsConfig()


def _inputs(gap, std, norm, dtype=jnp.float32):
    return L.LiquidInputs(
        q_gap=jnp.full((4,), gap, dtype),
        eval_q_std_ema=jnp.asarray(std, dtype),
        context_norm=jnp.asarray(norm, dtype),
    )


def _run(cfg, state, inputs, n, **kw):
    """n updates with constant inputs; returns the final state and the liquid_mod path."""
    liquid = L.make_liquid(cfg, **kw)
    return jax.jit(lambda s: jax.lax.scan(lambda s, _: liquid.step(s, inputs), s, None, length=n))(
        state
    )


@pytest.mark.parametrize(("rk4", "tol"), [(False, 1.5e-2), (True, 1e-6)])
def test_m14_euler_and_rk4_match_the_analytic_relaxation(rk4, tol):
    # Constant inputs with the gap exactly at target (A = 1: 10 · 0.0625 = 0.625), so the
    # update is the pure relaxation dm/dt = (1 − m)/τ with τ = τ_min (zero gap velocity).
    cfg = dataclasses.replace(CFG, liquid_dt=0.05, liquid_tau_min=2.0, liquid_rk4_threshold=1.0)
    n, m0 = 200, 3.0
    with jax.enable_x64(True):
        liquid = L.make_liquid(cfg)
        s0 = jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x, liquid.init_state()
        )
        s0 = s0.replace(mod=jnp.full((4,), m0, jnp.float64))
        inputs = _inputs(0.625, 0.0625, 2.0 if rk4 else 0.5, jnp.float64)
        state, mods = _run(cfg, s0, inputs, n)
        t = cfg.liquid_dt * np.arange(1, n + 1)
        exact = 1.0 + (m0 - 1.0) * np.exp(-t / cfg.liquid_tau_min)
        assert mods.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(state.tau), cfg.liquid_tau_min)
        assert bool(state.used_rk4) is rk4
        err = np.abs(np.asarray(mods[:, 0]) - exact).max()
        assert err < tol, err
        if not rk4:  # first order: the per-step factor is exactly 1 − h
            h = cfg.liquid_dt / cfg.liquid_tau_min
            np.testing.assert_allclose(mods[:, 0], 1 + (m0 - 1) * (1 - h) ** np.arange(1, n + 1))
            assert err > 1e-5  # and not RK4-accurate


def test_m14_rk4_chosen_when_context_norm_exceeds_threshold():
    cfg = dataclasses.replace(CFG, liquid_dt=1.0, liquid_tau_min=2.0, liquid_rk4_threshold=1.0)
    liquid = L.make_liquid(cfg)
    s0 = liquid.init_state().replace(mod=jnp.full((4,), 2.0))
    step = jax.jit(liquid.step)
    h = 0.5
    euler = 1 + 1.0 * (1 - h)
    rk4 = 1 + 1.0 * (1 - h + h**2 / 2 - h**3 / 6 + h**4 / 24)
    for norm, expect, flag in ((0.99, euler, False), (1.01, rk4, True)):
        state, mod = step(s0, _inputs(0.625, 0.0625, norm))
        np.testing.assert_allclose(mod, expect, rtol=1e-6)
        assert bool(state.used_rk4) is flag
    np.testing.assert_allclose(L.relax(jnp.float32(2.0), 2.0, 1.0, jnp.bool_(True)), rk4, rtol=1e-6)


def test_m14_spread_amplifier_target_and_clip():
    cfg = dataclasses.replace(CFG, liquid_max=4.0)
    assert cfg.liquid_gap_floor == 0.05
    # reward unit 6: the floor is 0.05 · 6 = 0.3 in Q units
    liquid = L.make_liquid(cfg, reward_unit=6.0)
    step = jax.jit(liquid.step)
    s0 = liquid.init_state()
    # target_gap = max(10 · 0.01, 0.3) = 0.3 (floor); gap 0.15 → amplifier 2.
    _, mod = step(s0, _inputs(0.15, 0.01, 0.0))
    np.testing.assert_allclose(mod, 2.0, rtol=1e-6)
    # target_gap = 10 · 0.06 = 0.6; gap 0.4 → 1.5.
    _, mod = step(s0, _inputs(0.4, 0.06, 0.0))
    np.testing.assert_allclose(mod, 1.5, rtol=1e-6)
    # A collapsed gap would ask for ×3e5: clipped to liquid_max, and stays clipped.
    state, mod = step(s0, _inputs(1e-6, 0.01, 0.0))
    np.testing.assert_allclose(mod, 4.0)
    _, mod = step(state, _inputs(1e-6, 0.01, 0.0))
    np.testing.assert_allclose(mod, 4.0)
    # Compounding while the gap stays below target (a leaky integrator of the amplifier).
    _, mods = _run(cfg, s0, _inputs(0.25, 0.01, 0.0), 20, reward_unit=6.0)
    assert np.all(np.diff(np.asarray(mods[:, 0])) > 0) and float(mods[-1, 0]) <= 4.0


@pytest.mark.parametrize("unit", [1.0, 1e-3, 40.0])
def test_m14_target_gap_floor_is_in_reward_units(unit):
    """target_gap = max(mult · eval_q_std_ema, gap_floor · unit): the same amplifier for Q
    expressed in any reward unit (gap and eval spread scale with it)."""
    liquid = L.make_liquid(CFG, reward_unit=unit)
    s0 = liquid.init_state()
    # floor binding: target 0.05·unit, gap 0.02·unit → 2.5
    _, mod = liquid.step(s0, _inputs(0.02 * unit, 0.001 * unit, 0.0))
    np.testing.assert_allclose(mod, 2.5, rtol=1e-5)
    # eval spread binding: target 10·0.03·unit, gap 0.2·unit → 1.5
    _, mod = liquid.step(s0, _inputs(0.2 * unit, 0.03 * unit, 0.0))
    np.testing.assert_allclose(mod, 1.5, rtol=1e-5)


def test_m14_target_gap_is_capped_at_l3s_bound():
    """target_gap = min(max(mult · eval_q_std_ema, floor), cap): L3 fades out at its max gap,
    so M14 never asks for a larger spread (the seed's 10× amplifier chased a Q spread L3
    itself inflated, liquid_mod pinned at its clip 4 in every run)."""
    cap = 0.2
    capped = L.make_liquid(CFG, gap_cap=cap)
    free = L.make_liquid(CFG)
    s0 = capped.init_state()
    # 10 · 0.06 = 0.6 → capped to 0.2; gap 0.1 → 2 (uncapped: 6, clipped to liquid_max 4)
    _, mod = capped.step(s0, _inputs(0.1, 0.06, 0.0))
    np.testing.assert_allclose(mod, 2.0, rtol=1e-6)
    _, mod = free.step(s0, _inputs(0.1, 0.06, 0.0))
    np.testing.assert_allclose(mod, CFG.liquid_max)
    # a gap already at the cap is not amplified, however large the validation spread
    _, mod = capped.step(s0, _inputs(cap, 100.0, 0.0))
    np.testing.assert_allclose(mod, 1.0, rtol=1e-6)
    # the cap wins over the floor too (floor 0.05 · 10 = 0.5 > cap)
    _, mod = L.make_liquid(CFG, reward_unit=10.0, gap_cap=cap).step(s0, _inputs(0.1, 0.0, 0.0))
    np.testing.assert_allclose(mod, 2.0, rtol=1e-6)
    # at a constant gap beyond the cap, mod decays below 1 (the amplifier is < 1)
    _, mods = _run(CFG, s0, _inputs(2 * cap, 100.0, 0.0), 30, gap_cap=cap)
    assert np.all(np.asarray(mods) < 1.0)


def test_m14_tau_from_velocity_and_adaptive_alpha():
    liquid = L.make_liquid(CFG)
    step = jax.jit(liquid.step)
    state, _ = step(liquid.init_state(), _inputs(0.5, 0.05, 0.0))
    assert bool(state.initialized)
    np.testing.assert_allclose(state.gap_ema, 0.5)  # the first update sets the EMA
    gaps = jnp.array([0.5, 0.505, 0.6, 2.0])  # stuck, slow, fast, jump
    new, _ = step(state, L.LiquidInputs(gaps, jnp.float32(0.05), jnp.float32(0)))
    alpha, tau, vel = (np.asarray(x) for x in (new.alpha, new.tau, new.velocity))
    np.testing.assert_allclose(alpha[0], CFG.liquid_alpha_min)  # no surprise
    assert np.all(np.diff(alpha) > 0) and alpha[-1] < CFG.liquid_alpha_max
    np.testing.assert_allclose(vel, alpha * (np.asarray(gaps) - 0.5), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(tau[0], CFG.liquid_tau_min)  # stuck → smallest τ
    assert np.all(np.diff(tau) > 0) and tau[-1] <= CFG.liquid_tau_max  # faster → larger τ
    ema = 0.5 + alpha * (np.asarray(gaps) - 0.5)
    speed = np.abs(vel) / ema
    expect = CFG.liquid_tau_min + (CFG.liquid_tau_max - CFG.liquid_tau_min) * np.tanh(
        speed / CFG.liquid_velocity_ref
    )
    np.testing.assert_allclose(tau, expect, rtol=1e-5)


def test_m14_off_is_identity_and_config_checked():
    liquid = L.make_liquid(dataclasses.replace(CFG, liquid=False))
    s0 = liquid.init_state()
    state, mod = liquid.step(s0, _inputs(1e-6, 0.5, 5.0))
    np.testing.assert_array_equal(mod, 1.0)
    chex.assert_trees_all_equal(state, s0)
    # The ordering of the bounds is a cross-field check of the config (made at load time).
    with pytest.raises(ConfigError, match="liquid_tau_min"):
        C.load(None, ["dynamics.liquid_tau_min=10.0", "dynamics.liquid_tau_max=5.0"])
    with pytest.raises(ConfigError, match="liquid_tau_min"):
        dataclasses.replace(C.Config(), dynamics=dataclasses.replace(CFG, liquid_tau_min=60.0))


def test_m14_vmaps_over_a_seed_axis():
    liquid = L.make_liquid(CFG, reward_unit=6.0)  # floor 0.3
    states = jax.vmap(lambda _: liquid.init_state())(jnp.arange(3))
    inputs = L.LiquidInputs(
        q_gap=jnp.array([[0.1] * 4, [0.2] * 4, [0.3] * 4]),
        eval_q_std_ema=jnp.full((3,), 0.01),
        context_norm=jnp.array([0.0, 2.0, 0.0]),
    )
    new, mod = jax.jit(jax.vmap(liquid.step))(states, inputs)
    chex.assert_shape(mod, (3, 4))
    np.testing.assert_array_equal(new.used_rk4, [False, True, False])
    np.testing.assert_allclose(mod[:, 0], [3.0, 1.5, 1.0], rtol=1e-6)
