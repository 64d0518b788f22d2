"""The one resolution step (docs/DESIGN.md, D1, L8, A3): what each setting means here."""

import dataclasses

import numpy as np
import pytest

from jaxdqn.agent.resolve import (
    Projection,
    acting_activations,
    acting_kernels,
    acting_product,
    gated_kernels,
    head_kernels,
    in_q_units,
    make_device_config,
    replay_weighting,
    resolve,
    resolve_kernels,
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


def test_a3_resolve_puts_every_reward_unit_threshold_in_q_units_once(monkeypatch):
    monkeypatch.setattr("jax.default_backend", lambda: "cpu")  # the kernel rows below: the CPU's
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


@pytest.mark.parametrize(
    "name,rule,default,choices",
    [
        ("heads", head_kernels, "blockdiag", ("split", "pallas", "interpret")),
        (
            "gated",
            gated_kernels,
            "reference",
            ("pallas", "interpret", "gate", "gate_interpret", "gate_grad", "gate_grad_interpret"),
        ),
        ("acting", acting_kernels, "reference", ("pallas", "interpret")),
    ],
    ids=["m6_heads", "m3_m4_gated", "m6_m7_acting"],
)
def test_m6_m3_fused_kernel_settings_resolve_auto_to_the_default_and_need_the_fused_branches(
    name, rule, default, choices, monkeypatch
):
    """kernels.heads (M6), kernels.gated (M3 + M4) and kernels.acting (M6 + M7 in acting): auto
    is the measured default on the CPU (the GPU's is the next test's); the other choices need
    the fused branches (an error with kernels.fused=reference, the default where kernels.fused=auto
    picks the per-branch modules: the CPU)."""
    monkeypatch.setattr("jax.default_backend", lambda: "cpu")
    for fused in ("auto", "fused", "reference"):
        assert rule("auto", fused) == rule(default, fused) == default
    for setting in choices:
        assert rule(setting, "fused") == setting
        assert rule(setting, "auto") == default  # the CPU's per-branch modules
        with pytest.raises(ConfigError, match=f"kernels.{name}={setting} needs the fused"):
            rule(setting, "reference")
    cfg = Config()
    kernels = dataclasses.replace(cfg.kernels, fused="fused", **{name: choices[-1]})
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.fused, getattr(r, name), r.statistics) == (True, choices[-1], "reference")
    assert getattr(resolve(cfg, _Market(_closes())), name) == default


def test_m6_m7_m3_m4_auto_acts_per_action_through_the_gate_kernel_on_a_gpu(monkeypatch):
    """On a GPU with the fused branches, kernels.acting auto = pallas (the heads per action with
    M7 in their epilogue) and kernels.gated auto = gate beside it: the pair measured and
    learning-checked together. Without the fused branches, on the CPU or where acting is set to
    the reference, both stay the reference; a setting other than auto is kept."""
    monkeypatch.setattr("jax.default_backend", lambda: "cpu")
    assert (acting_kernels("auto", "fused"), gated_kernels("auto", "fused")) == (
        "reference",
        "reference",
    )  # the CPU: no Triton
    monkeypatch.setattr("jax.default_backend", lambda: "gpu")
    for fused in ("auto", "fused"):
        assert acting_kernels("auto", fused) == "pallas"
        assert gated_kernels("auto", fused) == gated_kernels("auto", fused, "pallas") == "gate"
        assert gated_kernels("auto", fused, "interpret") == "reference"  # not the GPU pair
        assert gated_kernels("auto", fused, "reference") == "reference"
        assert gated_kernels("pallas", fused, "auto") == "pallas"
        assert acting_kernels("reference", fused) == "reference"
    assert acting_kernels("auto", "reference") == gated_kernels("auto", "reference") == "reference"
    r = resolve(Config(), _Market(_closes()))
    assert (r.fused, r.acting, r.gated, r.acting_product) == (True, "pallas", "gate", "f32")
    cfg = Config()
    kernels = dataclasses.replace(cfg.kernels, acting_product="bf16")
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.acting, r.gated, r.acting_product) == ("pallas", "gate", "bf16")
    monkeypatch.setattr("jax.default_backend", lambda: "tpu")
    assert (acting_kernels("auto", "fused"), gated_kernels("auto", "fused")) == (
        "reference",
        "reference",
    )


def test_m3_m4_acting_product_bf16_needs_the_acting_and_gate_kernels():
    """kernels.acting_product=bf16 is the product acting's gate kernel reads: with both kernels
    asked for it resolves as set (also where they resolve to the reference: nothing reads it
    there); without either it is an error naming both settings; f32 goes with anything."""
    assert acting_product("bf16", "pallas", "gate") == "bf16"
    assert acting_product("bf16", "interpret", "gate_interpret") == "bf16"
    assert acting_product("bf16", "pallas", "gate_grad") == "bf16"  # the same forward kernel
    assert acting_product("bf16", "interpret", "gate_grad_interpret") == "bf16"
    assert (
        acting_product("bf16", "auto", "auto") == acting_product("bf16", "auto", "gate") == "bf16"
    )
    for acting, gated in (("reference", "gate"), ("pallas", "pallas"), ("reference", "auto")):
        assert acting_product("f32", acting, gated) == "f32"
        with pytest.raises(ConfigError, match=f"kernels.acting={acting} and kernels.gated={gated}"):
            acting_product("bf16", acting, gated)
    cfg = Config()
    kernels = dataclasses.replace(cfg.kernels, acting_product="bf16", gated="reference")
    with pytest.raises(ConfigError, match=r"kernels\.acting_product=bf16"):
        resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    kernels = dataclasses.replace(kernels, fused="fused", acting="pallas", gated="gate")
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.acting_product, resolve(cfg, _Market(_closes())).acting_product) == ("bf16", "f32")


def test_m1_m2_acting_activations_bf16_needs_the_bfloat16_product():
    """kernels.acting_activations=bf16 hands the branches bfloat16 features, which only the
    bfloat16 product reads: with it the setting resolves as set, without it one error line
    naming kernels.acting_product; f32 goes with anything."""
    assert acting_activations("bf16", "bf16") == "bf16"
    assert acting_activations("f32", "f32") == acting_activations("f32", "bf16") == "f32"
    with pytest.raises(ConfigError, match=r"needs kernels\.acting_product=bf16, got .*=f32"):
        acting_activations("bf16", "f32")
    cfg = Config()
    kernels = dataclasses.replace(
        cfg.kernels, fused="fused", acting="pallas", gated="gate", acting_activations="bf16"
    )
    with pytest.raises(ConfigError, match=r"kernels\.acting_activations=bf16"):
        resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    kernels = dataclasses.replace(kernels, acting_product="bf16")
    r = resolve(dataclasses.replace(cfg, kernels=kernels), _Market(_closes()))
    assert (r.acting_product, r.acting_activations) == ("bf16", "bf16")
    assert resolve(cfg, _Market(_closes())).acting_activations == "f32"


def test_m6_m3_p1_resolve_kernels_names_what_resolve_runs_on_this_backend(monkeypatch):
    """resolve_kernels (a run's provenance) gives the same answers as resolve, by name: the
    CPU's per-branch modules and references, a GPU's per-action acting through the gate
    kernel; a bad combination is the rules' error."""
    monkeypatch.setattr("jax.default_backend", lambda: "cpu")
    cpu = resolve_kernels(Config())
    assert cpu == {
        "fused": "per_branch",
        "heads": "blockdiag",
        "statistics": "reference",
        "gated": "reference",
        "acting": "reference",
        "acting_product": "f32",
        "acting_activations": "f32",
        "learner_activations": "f32",
        "loss_head": "reference",
        "target_head": "reference",
        "projection": "reference",
    }
    monkeypatch.setattr("jax.default_backend", lambda: "gpu")
    cfg = Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    gpu, r = resolve_kernels(cfg), resolve(cfg, _Market(_closes()))
    assert gpu == {
        **cpu,
        "fused": "fused",
        "gated": "gate",
        "acting": "pallas",
        "projection": "pallas",
    }
    assert (r.fused, r.gated, r.acting, r.projection.backend) == (True, "gate", "pallas", "pallas")
    kernels = dataclasses.replace(cfg.kernels, acting="reference", acting_product="bf16")
    with pytest.raises(ConfigError, match=r"kernels\.acting_product=bf16"):
        resolve_kernels(dataclasses.replace(cfg, kernels=kernels))


def test_p1_provenance_names_the_projection_kernel_the_pallas_backend_runs(monkeypatch, tmp_path):
    """A run's provenance tells P1's two Pallas kernels apart: ``pallas:hat`` at the model's
    ≤ 64 atoms on a GPU under train.deterministic; the CPU's reference stays ``reference``."""
    from jaxdqn.program.records.provenance import provenance

    monkeypatch.setattr("jax.default_backend", lambda: "cpu")
    assert " projection=reference" in provenance(Config(), tmp_path)["kernels"]
    monkeypatch.setattr("jax.default_backend", lambda: "gpu")
    cfg = Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    assert provenance(cfg, tmp_path)["kernels"].endswith(" projection=pallas:hat")
    kernels = dataclasses.replace(cfg.kernels, projection="window")
    window = provenance(dataclasses.replace(cfg, kernels=kernels), tmp_path)["kernels"]
    assert window.endswith(" projection=window")
