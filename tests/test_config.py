"""Config loading: YAML + dotted overrides, unknown keys and bad values are one-line errors."""

from pathlib import Path

import pytest

from jaxdqn import config as C

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
            "learner.lr=1e-4",
        ],
    )
    assert cfg.learner.lr == 1e-4
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
    assert text == C.DEFAULT_HEADER + C.commented_yaml() + "\n"


def test_config_all_off_switches_every_component():
    cfg = C.load(None, list(C.ALL_OFF))
    assert not any(getattr(cfg.model, k) for k in C.MODEL_SWITCHES)
    assert not any(getattr(cfg.learner, k) for k in C.LEARNER_SWITCHES)
    on = C.Config()
    assert all(getattr(on.model, k) for k in C.MODEL_SWITCHES)  # default: all on
    assert all(getattr(on.learner, k) for k in C.LEARNER_SWITCHES)
    bools = {f.name for f in C.dataclasses.fields(C.ModelConfig) if f.type in (bool, "bool")}
    assert bools == set(C.MODEL_SWITCHES)  # no model switch is missing from the list
