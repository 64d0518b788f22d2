"""The one resolution step (docs/DESIGN.md, D1, L8, A3): what each setting means here."""

import dataclasses

import numpy as np
import pytest

from jaxdqn.agent.resolve import (
    Projection,
    gated_kernels,
    head_kernels,
    in_q_units,
    make_device_config,
    replay_weighting,
    resolve,
    reward_units,
)
from jaxdqn.config import Config, ConfigError, ReplayConfig
from jaxdqn.shards import Shards


class _Market:
    """The one thing resolve reads of a market: the train split's closes."""

    def __init__(self, close):
        self.close = np.asarray(close, np.float64)

    def train_closes(self):
        return self.close


def _closes(n=300, seed=0):
    return 100.0 * np.exp(np.cumsum(np.random.default_rng(seed).normal(0, 0.01, n)))


def test_l8_prioritised_off_is_alpha_zero_and_unit_weights():
    assert replay_weighting(ReplayConfig(prioritised=False, priority_alpha=0.7)) == (0.0, False)
    assert replay_weighting(ReplayConfig(prioritised=True, priority_alpha=0.7)) == (0.7, True)


def test_a3_resolve_puts_every_reward_unit_threshold_in_q_units_once():
    cfg = Config()
    cfg = dataclasses.replace(
        cfg,
        loss=dataclasses.replace(cfg.loss, reward_scale=50.0, gamma=0.9, n_step=3),
        acting=dataclasses.replace(cfg.acting, tau_floor=0.02),
    )
    close = _closes()
    r = resolve(cfg, _Market(close))
    scale, unit = reward_units(50.0, close)
    assert (r.reward_scale, r.reward_unit) == (scale, unit) and unit != 1.0
    assert r.temperature_floor == in_q_units(0.02, unit) == 0.02 * unit
    assert r.spread_max_gap == cfg.loss.spread_max_gap * unit
    assert r.gamma_n == 0.9**3
    assert (r.replay_alpha, r.importance_weights) == replay_weighting(cfg.replay)
    assert r.projection == Projection("reference", "reference")  # the CPU
    assert not r.fused  # kernels.fused auto on the CPU
    assert r.heads == "blockdiag"
    assert r.cfg is cfg and r.learning_starts == cfg.replay.learning_starts


def test_x1_resolve_gives_one_device_its_share_and_keeps_learning_starts_global():
    cfg = Config()
    r = resolve(cfg, _Market(_closes()), Shards(axis="data", count=2))
    assert r.cfg == make_device_config(cfg, 2)
    assert r.cfg.replay.batch_size == cfg.replay.batch_size // 2
    assert r.learning_starts == cfg.replay.learning_starts
    with pytest.raises(ConfigError, match="divisible by 3"):
        resolve(cfg, _Market(_closes()), Shards(axis="data", count=3))


def test_m3_kernels_gated_resolves_auto_to_reference_and_needs_the_fused_branches():
    for fused in ("auto", "fused", "reference"):
        assert gated_kernels("auto", fused) == gated_kernels("reference", fused) == "reference"
    for setting in ("pallas", "interpret"):
        assert gated_kernels(setting, "fused") == setting
        assert gated_kernels(setting, "auto") == "reference"  # the CPU's per-branch modules
        with pytest.raises(ConfigError, match=f"kernels.gated={setting} needs the fused"):
            gated_kernels(setting, "reference")
    cfg = Config()
    kernels = dataclasses.replace(cfg.kernels, gated="interpret", fused="fused")
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.fused, r.heads, r.gated) == (True, "blockdiag", "interpret")
    assert resolve(cfg, _Market(_closes())).gated == "reference"


def test_m6_kernels_heads_resolves_auto_to_blockdiag_and_needs_the_fused_branches():
    for fused in ("auto", "fused", "reference"):
        assert head_kernels("auto", fused) == head_kernels("blockdiag", fused) == "blockdiag"
    for setting in ("split", "pallas", "interpret"):
        assert head_kernels(setting, "fused") == setting
        # kernels.fused=auto on the CPU: the per-branch modules, nothing to pick
        assert head_kernels(setting, "auto") == "blockdiag"
        with pytest.raises(ConfigError, match=f"kernels.heads={setting} needs the fused"):
            head_kernels(setting, "reference")
    cfg = Config()
    kernels = dataclasses.replace(cfg.kernels, heads="split", fused="fused")
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.fused, r.heads, r.statistics) == (True, "split", "reference")
