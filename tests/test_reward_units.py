"""Reward units (issue 11; docs/DESIGN.md, A1, L1): ``loss.reward_scale: auto`` puts Q in units of
one daily return std of the train split, so every Q threshold (A1/L2 floors, L7 minimum, M14
target gap, L3 bound) is relative to the reward unit — against numpy by hand."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxdqn import config
from jaxdqn.agent.build import build_agent
from jaxdqn.agent.resolve import reward_units
from jaxdqn.config import ConfigError
from jaxdqn.market import market as market_lib

SMOKE = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"


def test_reward_units_auto_and_a_number_by_hand():
    close = np.array([100.0, 101.0, 99.5, 102.0, 102.0, 101.2])
    r = np.log(close[1:] / close[:-1])
    sigma = np.sqrt(((r - r.mean()) ** 2).sum() / (len(r) - 1))  # ddof = 1
    scale, unit = reward_units("auto", close)
    assert scale == pytest.approx(1.0 / sigma, rel=1e-12) and unit == 1.0
    # Q in units of one day's return std: a one-sigma day is worth 1
    assert scale * sigma == pytest.approx(1.0)
    scale, unit = reward_units(100.0, close)
    assert scale == 100.0 and unit == pytest.approx(100.0 * sigma, rel=1e-12)
    scale, unit = reward_units(3, close)
    assert (scale, unit) == (3.0, pytest.approx(3.0 * sigma, rel=1e-12))
    assert isinstance(scale, float) and isinstance(unit, float)
    # the price level does not matter, only the returns
    assert reward_units("auto", close * 37.0)[0] == pytest.approx(1.0 / sigma, rel=1e-9)


@pytest.mark.parametrize("close", [[50.0] * 10, [50.0, 51.0], [50.0]])
def test_reward_units_without_variance_is_a_config_error(close):
    for scale in ("auto", 100.0):
        with pytest.raises(ConfigError, match=r"loss\.reward_scale: .*no variance") as e:
            reward_units(scale, np.asarray(close))
        assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def smoke():
    cfg = config.load(SMOKE)
    return cfg, market_lib.prepare(cfg)


def _train_sigma(p):
    lo, hi = p.bar_range("train")
    close = np.asarray(p.market.close, np.float64)[lo:hi]
    return np.std(np.diff(np.log(close)), ddof=1)


def test_reward_units_build_agent_auto_is_one_over_the_train_std(smoke):
    cfg, p = smoke
    assert cfg.loss.reward_scale == "auto"
    sigma = _train_sigma(p)
    assert 0.005 < sigma < 0.03  # daily S&P 500 returns
    agent = build_agent(cfg, p)
    assert agent.reward_scale == pytest.approx(1.0 / sigma, rel=1e-9)
    assert agent.reward_unit == 1.0
    dyn = agent.dynamics.init(agent.model.xlstm.init_state(), 0.0)
    np.testing.assert_allclose(dyn.support.half_width, cfg.dynamics.support_half_width)


def test_reward_units_build_agent_with_a_number_sets_the_unit_and_support(smoke):
    _, p = smoke
    sigma = _train_sigma(p)
    fixed = config.load(SMOKE, ["loss.reward_scale=100"])
    agent = build_agent(fixed, p)
    assert agent.reward_scale == 100.0
    assert agent.reward_unit == pytest.approx(100.0 * sigma, rel=1e-9)
    # the initial support is configured in reward units
    dyn = agent.dynamics.init(agent.model.xlstm.init_state(), 0.0)
    np.testing.assert_allclose(
        dyn.support.half_width, fixed.dynamics.support_half_width * agent.reward_unit, rtol=1e-6
    )
    v_min, _ = jax.device_get(agent.dynamics.grid(dyn))
    np.testing.assert_allclose(v_min, -fixed.dynamics.support_half_width * agent.reward_unit)
