"""Loading configs: YAML files and dotted ``key=value`` overrides → a validated :class:`Config`.

Unknown keys and ill-typed or out-of-range values raise :class:`ConfigError` whose one-line
message names the full dotted key. Keys of configs saved before the sections were split by
concept (2026-11-30: ``learner.*``, ``model.liquid*``, ``model.kan_backend``, the schedule keys
of ``train``; 2026-12-03: ``eval.periods_per_year``, now ``data.bars_per_year``) are answered
with the key that replaced them (:data:`MOVED`); keys that were
removed outright say why and what replaces them (:data:`REMOVED`).
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from jaxdqn.config.sections import Config, ConfigError

__all__ = [
    "DEFAULT_HEADER",
    "MOVED",
    "REMOVED",
    "commented_yaml",
    "describe",
    "differences",
    "dump",
    "inline_yaml",
    "load",
    "to_dict",
]

#: Old dotted key → the key that replaced it.
MOVED: dict[str, str] = {
    "learner.num_envs": "acting.num_envs",
    "learner.act_steps": "acting.steps",
    "learner.iqn_blend": "acting.iqn_blend",
    "learner.iqn_readiness": "acting.iqn_readiness",
    "learner.position_sizing": "acting.position_sizing",
    "train.iqn_readiness_epochs": "acting.iqn_readiness_epochs",
    "learner.replay_capacity": "replay.capacity",
    "learner.learning_starts": "replay.learning_starts",
    "learner.batch_size": "replay.batch_size",
    "learner.prioritised": "replay.prioritised",
    "learner.priority_alpha": "replay.priority_alpha",
    "learner.priority_beta0": "replay.priority_beta0",
    "learner.beta_anneal_updates": "replay.beta_anneal_updates",
    "learner.updates": "optim.updates",
    "learner.lr": "optim.lr",
    "learner.clip_norm": "optim.clip_norm",
    "learner.aux_lr": "optim.aux_lr",
    "learner.xlstm_lr": "optim.xlstm_lr",
    "train.sgdr_period": "optim.sgdr_period",
    "train.sgdr_floor": "optim.sgdr_floor",
    "train.restart_moment_scale": "optim.restart_moment_scale",
    "learner.gamma": "loss.gamma",
    "learner.n_step": "loss.n_step",
    "learner.reward_scale": "loss.reward_scale",
    "learner.target_update": "loss.target_update",
    "learner.target_period": "loss.target_period",
    "learner.polyak_tau": "loss.polyak_tau",
    "learner.spread": "loss.spread",
    "learner.spread_branch_scale": "loss.spread_branch_scale",
    "learner.entropy": "loss.entropy",
    "learner.entropy_base": "loss.entropy_base",
    "learner.rank_rewards": "loss.rank_rewards",
    "learner.aux_training": "loss.aux_training",
    "learner.stats_alpha": "dynamics.stats_alpha",
    "learner.adaptive_support": "dynamics.adaptive_support",
    "learner.support_half_width": "dynamics.support_half_width",
    "learner.support_alpha": "dynamics.support_alpha",
    "learner.support_max_alpha": "dynamics.support_max_alpha",
    "model.liquid": "dynamics.liquid",
    **{
        f"model.liquid_{k}": f"dynamics.liquid_{k}"
        for k in (
            "alpha_min",
            "alpha_max",
            "tau_min",
            "tau_max",
            "velocity_ref",
            "dt",
            "rk4_threshold",
            "gap_mult",
            "gap_floor",
            "max",
        )
    },
    "learner.projection_backend": "kernels.projection",
    "model.kan_backend": "kernels.kan",
    "eval.periods_per_year": "data.bars_per_year",
}
_SPLIT_SECTIONS = {"learner": "acting, replay, optim, loss, dynamics and kernels"}
#: Removed dotted key → why, and what replaces it (the error reads "<key> was removed: <why>").
REMOVED: dict[str, str] = {
    "data.synthetic.range_frac": "the synthetic high/low now come from an intrabar Brownian "
    "bridge (data.synthetic.intrabar_vol, intrabar_steps)",
}


REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _coerce(key: str, typ: Any, value: Any) -> Any:
    """Check ``value`` against the annotation ``typ`` and return it in canonical form."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None:
            return None
        for typ_i in args[:-1]:  # e.g. float | str: a number if it reads as one
            try:
                return _coerce(key, typ_i, value)
            except ConfigError:
                pass
        return _coerce(key, args[-1], value)
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of sub-keys, got {value!r}")
        return _build(typ, value, key + ".")
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, str):
            # YAML 1.1 reads 1e-4 (no dot) as a string; accept every float literal Python does.
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if typ is str:
        if isinstance(value, (datetime.date, datetime.datetime)):
            return value.isoformat()[:10]
        if isinstance(value, (Mapping, list, tuple)) or value is None:
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(typ)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", elem, v) for i, v in enumerate(value))
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", str, v) for k, v in value.items()}
    raise TypeError(f"unsupported config annotation {typ!r} at {key}")  # programming error


def _check_range(key: str, f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, meta['choices']))}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        if meta.get("lo") is not None and value < meta["lo"]:
            raise ConfigError(f"{key}: must be >= {meta['lo']}, got {value!r}")
        if meta.get("hi") is not None and value > meta["hi"]:
            raise ConfigError(f"{key}: must be <= {meta['hi']}, got {value!r}")


def _unknown(key: str, value: Any) -> str:
    """The message for an unknown key: where it moved, or that it does not exist."""
    if key in MOVED:
        return f"{key} moved to {MOVED[key]}"
    if key in REMOVED:
        return f"{key} was removed: {REMOVED[key]}"
    if key in _SPLIT_SECTIONS:
        if isinstance(value, Mapping) and value:
            sub = next(iter(value))
            return _unknown(f"{key}.{sub}", value[sub])
        return f"{key}: this section was split into {_SPLIT_SECTIONS[key]}"
    if key.startswith("population."):
        from jaxdqn.config.population_sections import POPULATION_KEYS

        if isinstance(value, Mapping) and value:
            key = f"{key}.{next(iter(value))}"
        return (
            f"{key}: a population varies only {', '.join(POPULATION_KEYS)} (values that "
            "change no array shape; population.random and population.seed draw them from "
            "ranges); search other values as separate runs (python -m jaxdqn.sweep)"
        )
    section = key.split(".", 1)[0]
    if section in _SPLIT_SECTIONS:
        return f"{key}: unknown config key (the {section} section was split into " + (
            f"{_SPLIT_SECTIONS[section]})"
        )
    return f"{key}: unknown config key"


def _build(cls, values: Mapping[str, Any], prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in values.items():
        key = prefix + str(name)
        if name not in fields:
            raise ConfigError(_unknown(key, values[name]))
        v = _coerce(key, hints[name], value)
        _check_range(key, fields[name], v)
        kwargs[name] = v
    return cls(**kwargs)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (tuples as lists) suitable for YAML / JSON."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        elif isinstance(v, dict):
            v = dict(v)
        out[f.name] = v
    return out


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"{item}: overrides are written key=value (e.g. env.episode_length=128)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{item}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _set_nested(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


def load(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config: defaults ← YAML file at ``path`` (if given) ← dotted overrides.

    Args:
      path: a YAML file whose keys mirror :class:`Config`; ``None`` uses the defaults
        (identical to ``configs/default.yaml``).
      overrides: strings ``"a.b=value"``; values are parsed as YAML scalars or lists.

    Raises:
      ConfigError: missing or unreadable file, unknown key, bad type or value (one line).
    """
    tree: dict = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"{p}: cannot read config file ({e.strerror or e})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            first = str(e).splitlines()[0] if str(e) else "invalid YAML"
            raise ConfigError(f"{p}: not valid YAML ({first})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of keys")
        tree = loaded
    for item in overrides:
        keys, value = _parse_override(item)
        _set_nested(tree, keys, value)
    return _build(Config, tree)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(a: Config, b: Config) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` for every leaf where ``a`` and ``b`` differ
    (sorted by key; a mapping such as ``data.columns`` is compared entry by entry)."""
    fa, fb = _flat(to_dict(a)), _flat(to_dict(b))
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def dump(cfg: Config) -> str:
    """YAML text of the fully resolved config (what a run directory stores)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def describe(cls=Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted key, default, help)`` for every leaf field, for ``--help`` listings."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(describe(hints[f.name], key + "."))
            continue
        default = _default(f)
        if isinstance(default, tuple):
            default = list(default)
        help_ = f.metadata.get("help", "")
        if f.metadata.get("choices"):
            help_ += f" [{' | '.join(map(str, f.metadata['choices']))}]"
        rows.append((key, inline_yaml(default), help_))
    return rows


def inline_yaml(value: Any) -> str:
    """``value`` as one line of YAML flow style (``[1, 2]``, ``auto``, ``0.5``, ``null``), as
    ``configs/default.yaml``, ``--help`` and ``key=value`` overrides write values."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def commented_yaml(cfg: Any = None, indent: int = 0) -> str:
    """YAML of ``cfg`` (default: the defaults) with each key's help as a comment above it.

    ``configs/default.yaml`` is this text for ``Config()``; ``python -m jaxdqn.config`` prints
    it.
    """
    cfg = Config() if cfg is None else cfg
    pad = " " * indent
    lines = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        lines.append(f"{pad}# {f.metadata.get('help', '')}")
        if dataclasses.is_dataclass(v):
            lines.append(f"{pad}{f.name}:")
            lines.append(commented_yaml(v, indent + 2))
            continue
        if isinstance(v, tuple):
            v = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        lines.append(f"{pad}{f.name}: {inline_yaml(v)}")
    return "\n".join(lines)


DEFAULT_HEADER = (
    "# The embedded default (CPU-friendly, bundled S&P 500): identical to the dataclass defaults\n"
    "# in jaxdqn/config/sections.py. Regenerate with: python -m jaxdqn.config > "
    "configs/default.yaml\n"
)
