"""Config loading: YAML + dotted overrides, unknown keys and bad values are one-line errors."""

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from jaxdqn import config as C
from jaxdqn.config.loading import DEFAULT_HEADER, REMOVED

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_config_default_yaml_equals_dataclass_defaults():
    assert C.load(CONFIGS / "default.yaml") == C.Config()


@pytest.mark.parametrize("name", ["default", "smoke", "gpu", "synthetic"])
def test_config_bundled_files_load(name):
    cfg = C.load(CONFIGS / f"{name}.yaml")
    assert isinstance(cfg, C.Config)


def test_config_overrides_are_typed():
    cfg = C.load(
        None,
        [
            "data.source=synthetic",
            "env.magnitude_levels=[0.1, 0.2, 0.3]",
            "data.train_end=2011-06-30",
            "env.half_spread_bps=2",
            "model.vsn=false",
            "optim.lr=1e-4",
        ],
    )
    assert cfg.optim.lr == 1e-4
    assert cfg.data.source == "synthetic"
    assert cfg.env.magnitude_levels == (0.1, 0.2, 0.3)
    assert cfg.data.train_end == "2011-06-30"  # YAML dates come back as ISO strings
    assert cfg.env.half_spread_bps == 2.0 and isinstance(cfg.env.half_spread_bps, float)
    assert cfg.model.vsn is False


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("nope=1", "nope: unknown config key"),
        ("env.nope=1", "env.nope: unknown config key"),
        ("env.episode_length=abc", "env.episode_length: expected an integer"),
        ("env.episode_length=1", "env.episode_length: must be >= 2"),
        ("model.vsn=1", "model.vsn: expected true or false"),
        ("data.source=ftp", "data.source: 'ftp' is not one of"),
        ("data.source=csv", "data.path: required"),
        ("env.magnitude_levels=[1, 2]", "env.magnitude_levels: need three values"),
        ("env.commission_bps=.nan", "env.commission_bps: must be finite"),
        ("data.train_end=2016-01-01", "data.val_end: must be after"),
        ("data.train_end=yesterday", "data.train_end: not an ISO date"),
        ("env=3", "env: expected a mapping"),
        ("noequals", "overrides are written key=value"),
    ],
)
def test_config_bad_values_name_the_key(override, fragment):
    with pytest.raises(C.ConfigError) as e:
        C.load(None, [override])
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg


def test_config_bad_files(tmp_path):
    with pytest.raises(C.ConfigError, match="cannot read config file"):
        C.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(C.ConfigError, match="not valid YAML"):
        C.load(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(C.ConfigError, match="top level must be a mapping"):
        C.load(lst)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("env:\n  spread: 3\n")
    with pytest.raises(C.ConfigError, match=r"env\.spread: unknown config key"):
        C.load(unknown)


def test_config_dump_roundtrips(tmp_path):
    cfg = C.load(None, ["seed=7", "data.columns={Px: close}", "env.episode_length=64"])
    path = tmp_path / "resolved.yaml"
    path.write_text(C.dump(cfg))
    assert C.load(path) == cfg


def test_config_describe_lists_every_leaf_with_help():
    rows = C.describe()
    keys = [k for k, _, _ in rows]
    assert "env.half_spread_bps" in keys and "data.synthetic.phi" in keys
    assert len(keys) == len(set(keys))
    assert all(help_ for _, _, help_ in rows)


def test_config_default_yaml_is_generated_from_the_dataclasses():
    text = (CONFIGS / "default.yaml").read_text()
    assert text == DEFAULT_HEADER + C.commented_yaml() + "\n"


def test_config_default_yaml_is_the_module_output():
    # `python -m jaxdqn.config > configs/default.yaml` regenerates the file byte for byte.
    out = subprocess.run(
        [sys.executable, "-m", "jaxdqn.config"],
        capture_output=True,
        text=True,
        check=True,
        cwd=CONFIGS.parent,
    ).stdout
    assert out == (CONFIGS / "default.yaml").read_text()


def _bools(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.type in (bool, "bool")}


def test_config_all_off_switches_every_component():
    cfg = C.load(None, list(C.ALL_OFF))
    on = C.load(None, list(C.ALL_ON))
    default = C.Config()
    for section, keys in C.SWITCHES.items():
        assert not any(getattr(getattr(cfg, section), k) for k in keys), section
        assert all(getattr(getattr(on, section), k) for k in keys), section
        # default: every component on except L3 (docs/LEARNING.md)
        off = {k for k in keys if not getattr(getattr(default, section), k)}
        assert off == ({"spread"} if section == "loss" else set()), section
    # The 18 component switches of the M, L and A components (docs/DESIGN.md), none missing
    # (L2's sampled target became a switch in issue 11).
    assert sum(len(keys) for keys in C.SWITCHES.values()) == 18
    assert _bools(C.ModelConfig) == set(C.SWITCHES["model"])  # no model switch missing
    hints = typing.get_type_hints(C.Config)
    for section, keys in C.SWITCHES.items():
        assert _bools(hints[section]) == set(keys), section
    # L8 (prioritised replay) is not an ablation switch: ALL_OFF leaves it as configured.
    assert cfg.replay.prioritised is True


def _dotted_keys(cls, prefix: str = "") -> set[str]:
    """Every dotted key of a config dataclass, sections and leaves alike."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        keys.add(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _dotted_keys(hints[f.name], key + ".")
    return keys


@pytest.mark.parametrize(
    ("override", "new"),
    [
        ("learner.gamma=0.9", "loss.gamma"),
        ("model.liquid=false", "dynamics.liquid"),
        ("learner.projection_backend=reference", "kernels.projection"),
        ("train.sgdr_period=3", "optim.sgdr_period"),
        ("model.kan_backend=reference", "kernels.kan"),
        ("learner.num_envs=8", "acting.num_envs"),
        ("learner.stats_alpha=0.1", "dynamics.stats_alpha"),
    ],
)
def test_config_old_keys_name_their_new_home(override, new, tmp_path):
    old = override.split("=", 1)[0]
    with pytest.raises(C.ConfigError) as e:
        C.load(None, [override])
    assert str(e.value) == f"{old} moved to {new}"
    # A saved YAML file with the old key fails the same way (one line).
    section, leaf = old.split(".")
    value = override.split("=", 1)[1]
    saved = tmp_path / "old.yaml"
    saved.write_text(f"{section}:\n  {leaf}: {value}\n")
    with pytest.raises(C.ConfigError) as e:
        C.load(saved)
    assert str(e.value) == f"{old} moved to {new}"


def test_config_old_keys_name_their_new_home_in_a_learner_section(tmp_path):
    saved = tmp_path / "saved.yaml"
    saved.write_text("seed: 1\nlearner:\n  gamma: 0.9\n  n_step: 5\n")
    with pytest.raises(C.ConfigError) as e:
        C.load(saved)
    assert str(e.value) == "learner.gamma moved to loss.gamma"
    # A learner key that never existed still names the sections it was split into.
    with pytest.raises(C.ConfigError) as e:
        C.load(None, ["learner.nope=1"])
    msg = str(e.value)
    assert msg.startswith("learner.nope: unknown config key") and "loss" in msg
    assert "\n" not in msg


def test_e2_config_removed_range_frac_says_what_replaced_it(tmp_path):
    expected = (
        "data.synthetic.range_frac was removed: the synthetic high/low now come from an "
        "intrabar Brownian bridge (data.synthetic.intrabar_vol, intrabar_steps)"
    )
    with pytest.raises(C.ConfigError) as e:
        C.load(None, ["data.synthetic.range_frac=0.5"])
    assert str(e.value) == expected
    saved = tmp_path / "old.yaml"
    saved.write_text("data:\n  source: synthetic\n  synthetic:\n    range_frac: 0.5\n")
    with pytest.raises(C.ConfigError) as e:
        C.load(saved)
    assert str(e.value) == expected
    keys = _dotted_keys(C.Config)
    for old, why in REMOVED.items():
        assert old not in keys and old not in C.MOVED
        # every key the message names exists
        for named in re.findall(r"[a-z_]+\.[a-z_.]+", why):
            assert named in keys, named
    # the replacements load, with their ranges
    cfg = C.load(None, ["data.synthetic.intrabar_vol=2.0", "data.synthetic.intrabar_steps=10"])
    assert (cfg.data.synthetic.intrabar_vol, cfg.data.synthetic.intrabar_steps) == (2.0, 10)
    assert C.Config().data.synthetic.intrabar_steps == 78
    with pytest.raises(C.ConfigError, match=r"data.synthetic.intrabar_steps: must be >= 2"):
        C.load(None, ["data.synthetic.intrabar_steps=1"])


def test_e1_config_limit_through_bps_default_and_range():
    assert C.Config().env.limit_through_bps == 5.0
    assert C.load(None, ["env.limit_through_bps=0"]).env.limit_through_bps == 0.0
    with pytest.raises(C.ConfigError, match=r"env.limit_through_bps: must be >= 0"):
        C.load(None, ["env.limit_through_bps=-1"])


def test_config_old_keys_name_their_new_home_which_exists():
    keys = _dotted_keys(C.Config)
    assert len(C.MOVED) >= 40
    for old, new in C.MOVED.items():
        assert new in keys, f"{old} -> {new}: no such key"
        assert old not in keys, f"{old} still exists"
        # and the new key loads with the config's own default value
        section, leaf = new.split(".")
        default = getattr(getattr(C.Config(), section), leaf)
        assert getattr(getattr(C.load(None, [f"{new}={_yaml(default)}"]), section), leaf) == (
            default
        )


def _yaml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["dynamics.liquid_tau_min=60"], "dynamics.liquid_tau_min: must be <="),
        (
            ["dynamics.liquid_tau_min=3", "dynamics.liquid_tau_max=2"],
            "dynamics.liquid_tau_min: must be <=",
        ),
        (["dynamics.liquid_alpha_min=0.9", "dynamics.liquid_alpha_max=0.5"], "liquid_alpha_min"),
        (
            ["replay.capacity=600", "replay.learning_starts=100", "acting.steps=10"],
            "replay.capacity: must hold one iteration's acting.num_envs * acting.steps",
        ),
        (
            ["replay.capacity=64", "replay.learning_starts=16", "acting.num_envs=8"],
            "replay.capacity: must hold replay.batch_size",
        ),
    ],
)
def test_config_cross_field_checks_live_in_config(overrides, fragment):
    with pytest.raises(C.ConfigError) as e:
        C.load(None, overrides)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_config_cross_field_limits_are_inclusive():
    # exactly one iteration's transitions fit; equal tau bounds are allowed
    cfg = C.load(
        None,
        [
            "replay.capacity=640",
            "replay.learning_starts=100",
            "acting.num_envs=64",
            "acting.steps=10",
            "dynamics.liquid_tau_min=50",
        ],
    )
    assert cfg.replay.capacity == cfg.acting.num_envs * cfg.acting.steps
    assert cfg.dynamics.liquid_tau_min == cfg.dynamics.liquid_tau_max
    # Constructing the dataclasses directly runs the same checks.
    with pytest.raises(C.ConfigError, match="liquid_tau_min"):
        C.Config(dynamics=C.DynamicsConfig(liquid_tau_min=60.0))


def test_reward_units_config_reward_scale_is_auto_or_a_positive_number(tmp_path):
    """``loss.reward_scale``: ``auto`` (the default) or a positive finite number; any other
    string or a non-positive number is a one-line ConfigError. Default γ for daily bars: 0.9."""
    assert C.Config().loss.reward_scale == "auto"
    assert C.Config().loss.gamma == 0.9
    assert C.load(None, ["loss.reward_scale=auto"]).loss.reward_scale == "auto"
    cfg = C.load(None, ["loss.reward_scale=100"])
    assert cfg.loss.reward_scale == 100.0 and isinstance(cfg.loss.reward_scale, float)
    assert C.load(None, ["loss.reward_scale=2.5e-3"]).loss.reward_scale == 2.5e-3
    saved = tmp_path / "scale.yaml"
    saved.write_text("loss:\n  reward_scale: 50\n")
    assert C.load(saved).loss.reward_scale == 50.0
    for bad, fragment in (
        ("abc", "loss.reward_scale: 'auto' or a positive number, got 'abc'"),
        ("AUTO", "loss.reward_scale: 'auto' or a positive number"),
        ("true", "loss.reward_scale: 'auto' or a positive number"),
        ("0", "loss.reward_scale: must be a positive number or auto, got 0.0"),
        ("-1", "loss.reward_scale: must be a positive number or auto, got -1.0"),
        (".inf", "loss.reward_scale: must be finite"),
    ):
        with pytest.raises(C.ConfigError) as e:
            C.load(None, [f"loss.reward_scale={bad}"])
        assert fragment in str(e.value) and "\n" not in str(e.value), bad
    # Constructing the dataclasses directly runs the same check.
    with pytest.raises(C.ConfigError, match=r"loss\.reward_scale"):
        C.Config(loss=C.LossConfig(reward_scale=-2.0))
    with pytest.raises(C.ConfigError, match=r"loss\.reward_scale"):
        C.Config(loss=C.LossConfig(reward_scale="one"))


def test_eval_config_policy_is_greedy_or_boltzmann():
    assert C.Config().eval.policy == "greedy"
    assert C.load(None, ["eval.policy=boltzmann"]).eval.policy == "boltzmann"
    with pytest.raises(C.ConfigError) as e:
        C.load(None, ["eval.policy=argmax"])
    assert str(e.value).startswith("eval.policy: 'argmax' is not one of greedy, boltzmann")


def test_e2_config_bars_per_year_is_auto_or_a_positive_number_and_moved_from_eval():
    assert C.load(None).data.bars_per_year == "auto"
    assert C.load(None, ["data.bars_per_year=8760"]).data.bars_per_year == 8760.0
    for bad, why in (
        ("hourly", "'auto' or a positive number"),
        ("-1", "positive"),
        ("0", "positive"),
    ):
        with pytest.raises(C.ConfigError, match=why):
            C.load(None, [f"data.bars_per_year={bad}"])
    with pytest.raises(C.ConfigError, match=r"eval\.periods_per_year moved to data\.bars_per_year"):
        C.load(None, ["eval.periods_per_year=252"])
    cfg = C.load(None, ["data.date_format=%d.%m.%Y", "data.dayfirst=true", "data.close_only=false"])
    assert (cfg.data.date_format, cfg.data.dayfirst, cfg.data.close_only) == (
        "%d.%m.%Y",
        True,
        False,
    )
    with pytest.raises(C.ConfigError, match=r"data\.dayfirst"):
        C.load(None, ["data.dayfirst=maybe"])
