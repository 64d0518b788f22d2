"""L7: adaptive support sized from the return distribution (module docstring of
jaxdqn/agent/support.py): h* = max(k·std(R_n)/sqrt(1 − γ²ⁿ), h_min), centre on the mean TD
target, both moved by the seed's EMA whose rate grows only for abnormal shifts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import support as S

GAMMA, N_STEP = 0.9, 3
GN = GAMMA**N_STEP
K, H_MIN = 5.0, 2.0
KW = dict(gamma_n=GN, sigmas=K, min_half=H_MIN, base_alpha=0.01, max_alpha=0.5, abnormal_k=3.0)


def _sigma_g(reward_std, gamma_n=GN):
    return reward_std / np.sqrt(1.0 - gamma_n**2)


def _update(st, td_mean, td_std, reward_std, **kw):
    f = jnp.float32
    return S.update_support(st, f(td_mean), f(td_std), f(reward_std), **{**KW, **kw})


def test_l7_grid_spans_centre_plus_minus_half():
    st = S.init_support(centre=1.0, half_width=2.0)
    z = S.support_atoms(st, 51)
    np.testing.assert_allclose([z[0], z[25], z[-1]], [-1.0, 1.0, 3.0], rtol=1e-6)
    v_min, dz = S.support_grid(st, 51)
    np.testing.assert_allclose(v_min, -1.0, rtol=1e-6)
    np.testing.assert_allclose(dz, 4.0 / 50, rtol=1e-6)


def test_l7_half_width_rule():
    # γⁿ = 0.729: σ_G = std(R_n)/sqrt(1 − 0.729²) = std · 1.46089...
    np.testing.assert_allclose(S.target_half_width(1.0, GN, K, H_MIN), K * _sigma_g(1.0), rtol=1e-6)
    np.testing.assert_allclose(
        S.target_half_width(0.5, GN, 3.0, H_MIN), 3.0 * 0.5 / np.sqrt(1 - GN**2), rtol=1e-6
    )
    np.testing.assert_allclose(S.target_half_width(0.7, 0.0, K, H_MIN), 3.5, rtol=1e-6)  # γⁿ=0
    np.testing.assert_allclose(S.target_half_width(0.01, GN, K, H_MIN), H_MIN)  # the floor
    # γⁿ → 1 is guarded (no division by zero)
    assert np.isfinite(float(S.target_half_width(1.0, 1.0, K, H_MIN)))


def test_l7_first_observation_sets_centre_and_half_width_directly():
    st = S.init_support(0.0, 0.1)  # the configured half-width is only a placeholder
    assert float(st.td_std_ema) == 0.0
    out = _update(st, 3.0, 0.5, 1.0)
    np.testing.assert_allclose(out.alpha, 1.0)
    np.testing.assert_allclose(out.centre, 3.0, rtol=1e-6)
    np.testing.assert_allclose(out.half_width, K * _sigma_g(1.0), rtol=1e-5)
    np.testing.assert_allclose(out.td_std_ema, 0.5, rtol=1e-6)


def _warm(td_std=0.1):
    """Seeded at centre 0, td_std_ema = td_std, half-width at its target for reward std 1."""
    st = S.init_support(0.0, 0.5)
    for _ in range(3):
        st = _update(st, 0.0, td_std, 1.0)
    np.testing.assert_allclose(st.td_std_ema, td_std, rtol=1e-6)
    return st


def test_l7_normal_oscillation_keeps_base_alpha():
    st = _warm()
    out = _update(st, 0.2, 0.1, 1.0)
    np.testing.assert_allclose(out.alpha, 0.01, rtol=1e-6)  # 0.2 < 3 · td_std_ema
    np.testing.assert_allclose(out.centre, 0.01 * 0.2, rtol=1e-5)
    # the natural-oscillation EMA moves at the base rate
    out = _update(st, 0.0, 0.3, 1.0)
    np.testing.assert_allclose(out.td_std_ema, 0.1 + 0.01 * (0.3 - 0.1), rtol=1e-5)


def test_l7_abnormal_shift_raises_alpha():
    st = _warm()
    big = _update(st, 5.0, 0.1, 1.0)
    np.testing.assert_allclose(big.alpha, 0.5, rtol=1e-6)  # beyond 2k std: max alpha
    np.testing.assert_allclose(big.centre, 2.5, rtol=1e-5)
    mid = _update(st, 0.45, 0.1, 1.0)
    # shift 0.45 = 1.5·(3·0.1): halfway between base and max
    assert 0.01 < float(mid.alpha) < 0.5
    np.testing.assert_allclose(mid.alpha, 0.01 + 0.49 * 0.5, rtol=1e-3)
    # the half-width moves at the same rate toward its target
    wide = _update(st, 5.0, 0.1, 2.0)
    np.testing.assert_allclose(
        wide.half_width, st.half_width + 0.5 * (K * _sigma_g(2.0) - st.half_width), rtol=1e-5
    )


def test_l7_half_width_tracks_target():
    st = _warm()
    out = _update(st, 0.0, 0.1, 3.0)
    np.testing.assert_allclose(
        out.half_width, st.half_width + 0.01 * (K * _sigma_g(3.0) - st.half_width), rtol=1e-5
    )


def _run(st, td_mean, td_std, reward_std, **kw):
    """``update_support`` over sequences of batch statistics; the half-width path."""
    kw = {**KW, **kw}

    def step(s, x):
        s = S.update_support(s, x[0], x[1], x[2], **kw)
        return s, (s.centre, s.half_width, s.alpha)

    xs = jnp.stack([jnp.asarray(v, jnp.float32) for v in (td_mean, td_std, reward_std)], axis=1)
    return jax.jit(lambda s, xs: jax.lax.scan(step, s, xs))(st, xs)


def test_l7_no_collapse_when_q_spread_is_tiny_but_rewards_are_not():
    """E[Q] nearly constant (spread 1e-3, e.g. an untrained or collapsed network) while the
    n-step rewards have std 1: the half-width stays at k·σ_G, never at its floor. The seed's
    rule max(10·q_gap, 3·q_std, 0.1) on the same batches shrinks to its floor 0.1."""
    rng = np.random.default_rng(0)
    steps, b = 2000, 128
    q = 1e-3 * rng.normal(size=(steps, b, 4, 3))
    r = rng.normal(size=(steps, b))
    td = r + GN * q[:, :, 0, 0]  # r + γⁿ E[Q'(s', a')]
    final, (_, half, _) = _run(S.init_support(0.0, 0.1), td.mean(1), td.std(1), r.std(1))
    half = np.asarray(half)
    want = K * _sigma_g(1.0)
    np.testing.assert_allclose(final.half_width, want, rtol=0.02)
    # never near the floor (the first batch's reward std sets the start: 1 ± 0.06·2.5)
    assert half.min() > 0.8 * want and half.min() > 2 * H_MIN
    # the seed's rule on the same batches: half → max(10·gap, 3·std, 0.1) = 0.1
    seed_half = 0.1
    for t in range(steps):
        gap = (q[t].max(-1) - q[t].min(-1)).mean()
        seed_half += 0.01 * (max(10 * gap, 3 * q[t].std(), 0.1) - seed_half)
    assert seed_half < 0.11


def _ar1_returns(phi, mu, length, horizon=150, seed=0):
    """An AR(1) reward process r_t = μ + φ(r_{t−1} − μ) + ε_t (ε ~ N(0, 1)), its n-step rewards
    R_n(t) = Σ_{k<n} γ^k r_{t+k}, the true values V(s_{t+n}) = E[G_{t+n} | r_{t+n−1}] and the
    realised returns G_t = Σ_k γ^k r_{t+k} (truncated at ``horizon``, γ^150 ≈ 1e-7)."""
    rng = np.random.default_rng(seed)
    eps = rng.normal(size=length)
    r = np.empty(length)
    r[0] = mu + eps[0] / np.sqrt(1 - phi**2)
    for t in range(1, length):
        r[t] = mu + phi * (r[t - 1] - mu) + eps[t]
    g = np.convolve(r, (GAMMA ** np.arange(horizon))[::-1], mode="valid")
    rn = np.convolve(r, (GAMMA ** np.arange(N_STEP))[::-1], mode="valid")
    m = len(g) - N_STEP
    value_next = mu / (1 - GAMMA) + phi * (r[N_STEP - 1 : N_STEP - 1 + m] - mu) / (1 - GAMMA * phi)
    return rn[:m], value_next, g


@pytest.mark.parametrize("phi", [0.0, 0.15, 0.5])
def test_l7_support_covers_the_returns(phi):
    """Coverage: L7 driven by batches of n-step targets R_n + γⁿ V(s') of an AR(1)/Gaussian
    reward process (γ = 0.9, n = 3) converges to a support that holds > 99 % of the realised
    returns G = Σ γ^k r_k (Gaussian G: k = 5 leaves ~1e-6 outside; φ = 0.5 makes σ_G from the
    i.i.d. formula ~20 % short, still far inside)."""
    mu = 0.05
    rn, value_next, g = _ar1_returns(phi, mu, 200_000)
    rng = np.random.default_rng(1)
    steps, b = 1500, 256
    idx = rng.integers(0, len(rn), size=(steps, b))
    td = rn[idx] + GN * value_next[idx]
    final, (centre, half, _) = _run(S.init_support(0.0, 0.1), td.mean(1), td.std(1), rn[idx].std(1))
    c, h = float(final.centre), float(final.half_width)
    np.testing.assert_allclose(c, mu / (1 - GAMMA), atol=0.1)  # the mean return
    np.testing.assert_allclose(h, K * rn.std() / np.sqrt(1 - GN**2), rtol=0.02)
    outside = np.mean(np.abs(g - c) > h)
    assert outside < 0.01, outside
    # steady state: each of the last 500 supports covers as well
    c_tail, h_tail = np.asarray(centre)[-500:], np.asarray(half)[-500:]
    assert np.mean(g < (c_tail - h_tail).max()) + np.mean(g > (c_tail + h_tail).min()) < 0.01


def test_l7_abnormal_shift_speeds_the_centre_catching_up():
    """A regime shift of the targets' mean by 10 std: the abnormal-shift rule (α up to 0.5)
    brings the centre within 4 std of the new mean in a few updates (the rest, a normal
    oscillation again, at the base rate); the base rate alone (max_alpha = base) takes ~90."""
    rng = np.random.default_rng(2)
    steps, b = 600, 128
    r = rng.normal(size=(steps, b))
    r[100:] += 10.0
    args = (S.init_support(0.0, 0.1), r.mean(1), r.std(1), r.std(1))
    _, (fast, _, alpha) = _run(*args)
    _, (slow, _, _) = _run(*args, max_alpha=0.01)
    fast, slow, alpha = (np.asarray(x) for x in (fast, slow, alpha))
    np.testing.assert_allclose(alpha[50:100], 0.01, rtol=1e-6)  # normal oscillation
    assert alpha[100] > 0.4  # the jump is abnormal
    assert np.all(fast[100:] >= slow[100:])

    def catch_up(path):
        return int(np.argmax(path[100:] > 6.0))  # updates until within 4 std of the new mean

    assert catch_up(fast) <= 3
    assert catch_up(slow) > 50
    np.testing.assert_allclose(alpha[-50:], 0.01, rtol=1e-6)  # back to the base rate
