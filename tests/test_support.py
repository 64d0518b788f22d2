"""L7: adaptive support."""

import jax.numpy as jnp
import numpy as np

from jaxdqn.agent import support as S


def test_l7_grid_spans_centre_plus_minus_half():
    st = S.init_support(centre=1.0, half_width=2.0)
    z = S.support_atoms(st, 51)
    np.testing.assert_allclose([z[0], z[25], z[-1]], [-1.0, 1.0, 3.0], rtol=1e-6)
    v_min, dz = S.support_grid(st, 51)
    np.testing.assert_allclose(v_min, -1.0, rtol=1e-6)
    np.testing.assert_allclose(dz, 4.0 / 50, rtol=1e-6)


def test_l7_half_width_rule():
    np.testing.assert_allclose(S.target_half_width(0.06, 0.01), 0.6, rtol=1e-6)
    np.testing.assert_allclose(S.target_half_width(0.01, 0.5), 1.5, rtol=1e-6)
    np.testing.assert_allclose(S.target_half_width(0.001, 0.001), 0.1, rtol=1e-6)


def _warm(q_std=0.1):
    st = S.init_support(0.0, 0.5)
    for _ in range(3):
        st = S.update_support(st, jnp.float32(0.0), jnp.float32(0.05), jnp.float32(q_std))
    return st


def test_l7_normal_oscillation_keeps_base_alpha():
    st = _warm()
    out = S.update_support(st, jnp.float32(0.2), jnp.float32(0.05), jnp.float32(0.1))
    np.testing.assert_allclose(out.alpha, 0.01, rtol=1e-6)  # 0.2 < 3 · q_std_ema
    np.testing.assert_allclose(out.centre, 0.01 * 0.2, rtol=1e-5)


def test_l7_abnormal_shift_raises_alpha():
    st = _warm()
    big = S.update_support(st, jnp.float32(5.0), jnp.float32(0.05), jnp.float32(0.1))
    np.testing.assert_allclose(big.alpha, 0.5, rtol=1e-6)  # beyond 2k std: max alpha
    np.testing.assert_allclose(big.centre, 2.5, rtol=1e-5)
    mid = S.update_support(st, jnp.float32(0.45), jnp.float32(0.05), jnp.float32(0.1))
    # shift 0.45 = 1.5·(3·0.1): halfway between base and max
    assert 0.01 < float(mid.alpha) < 0.5
    np.testing.assert_allclose(mid.alpha, 0.01 + 0.49 * 0.5, rtol=1e-3)


def test_l7_half_width_tracks_target():
    st = _warm()
    out = S.update_support(st, jnp.float32(0.0), jnp.float32(0.2), jnp.float32(0.1))
    np.testing.assert_allclose(
        out.half_width, st.half_width + 0.01 * (2.0 - st.half_width), rtol=1e-5
    )
