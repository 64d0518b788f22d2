"""Typed configuration: frozen dataclasses loaded from YAML with dotted ``key=value`` overrides.

Every field carries a one-line ``help`` (shown by ``--help`` of the command-line programs) and,
where it applies, ``choices`` or bounds. Unknown keys and ill-typed or out-of-range values raise
:class:`ConfigError` whose one-line message names the full dotted key.

The dataclass defaults *are* the CPU-friendly embedded default (``configs/default.yaml`` mirrors
them; a test keeps the two equal). ``configs/gpu.yaml`` sets the seed system's full sizes.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "ALL_OFF",
    "LEARNER_SWITCHES",
    "MODEL_SWITCHES",
    "BaselineConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "FeatureConfig",
    "LearnerConfig",
    "ModelConfig",
    "SyntheticConfig",
    "TrainConfig",
    "describe",
    "dump",
    "load",
    "to_dict",
]


class ConfigError(ValueError):
    """A bad configuration: unknown key, wrong type or value out of range (one-line message)."""


def _f(default: Any, help: str, *, choices: tuple | None = None, lo=None, hi=None):
    """A dataclass field with documentation and validation metadata."""
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _sub(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticConfig:
    """The synthetic market with a planted, known signal (E2)."""

    num_bars: int = _f(4000, "number of daily bars generated", lo=300)
    seed: int = _f(0, "seed of the generator (the market is a pure function of the config)")
    phi: float = _f(
        0.15,
        "AR(1) coefficient of close-to-close log returns (the planted signal)",
        lo=-0.99,
        hi=0.99,
    )
    vol: float = _f(0.01, "standard deviation of daily log-return innovations", lo=1e-5, hi=0.2)
    drift: float = _f(0.0, "unconditional mean daily log return", lo=-0.05, hi=0.05)
    start_price: float = _f(100.0, "first close", lo=1e-3)
    start_date: str = _f("2000-01-03", "date of the first bar (business-day calendar)")
    gap_frac: float = _f(
        0.25, "sd of the overnight gap log(open/prev close), in units of vol", lo=0.0, hi=1.0
    )
    range_frac: float = _f(
        0.5, "sd of the wicks beyond max/min(open, close), in units of vol", lo=0.0, hi=10.0
    )
    volume_median: float = _f(1.0e6, "median bar volume (volume is lognormal)", lo=1.0)
    volume_sigma: float = _f(0.3, "sd of log volume", lo=0.0, hi=5.0)


@dataclass(frozen=True)
class DataConfig:
    """Where the bars come from and how they are split (E2)."""

    source: str = _f(
        "sp500",
        "bars: bundled S&P 500 daily (1999-2018), a CSV or Parquet file, or the synthetic market",
        choices=("sp500", "csv", "parquet", "synthetic"),
    )
    path: str | None = _f(None, "file to read when source is csv or parquet")
    columns: dict[str, str] = _f(
        {}, "map of the file's column names to date/open/high/low/close/volume (e.g. {Px: close})"
    )
    split: str = _f(
        "date", "how train/val/test are cut: by dates or by fractions", choices=("date", "fraction")
    )
    train_end: str = _f("2012-12-31", "last date of the train split (split=date)")
    val_end: str = _f("2015-12-31", "last date of the val split; test runs to the end (split=date)")
    train_frac: float = _f(0.7, "fraction of bars in train (split=fraction)", lo=0.05, hi=0.95)
    val_frac: float = _f(0.15, "fraction of bars in val (split=fraction)", lo=0.01, hi=0.9)
    min_split_rows: int = _f(
        20, "fewest bars each of train (after the feature warmup), val and test may have", lo=2
    )
    synthetic: SyntheticConfig = _sub(SyntheticConfig, "synthetic market (source=synthetic)")


@dataclass(frozen=True)
class FeatureConfig:
    """Causal features and the observation window (E2)."""

    window: int = _f(8, "bars of features in one observation (t-window+1 .. t)", lo=1, hi=512)
    vol_span: int = _f(20, "EWMA span (bars) of the realised-volatility estimate sigma_hat", lo=2)
    clip: float = _f(5.0, "normalised features are clipped to [-clip, clip]", lo=0.5)
    gap: bool = _f(
        False,
        "add the overnight-gap feature log(open/prev close) (off: the bundled S&P data has "
        "open = previous close on most days before 2006)",
    )


@dataclass(frozen=True)
class EnvConfig:
    """The vectorised market environment (E1)."""

    episode_length: int = _f(256, "bars per training episode (H)", lo=2)
    max_leverage: float = _f(1.0, "largest |position| as a fraction of equity", lo=0.0, hi=10.0)
    magnitude_levels: tuple[float, ...] = _f(
        (0.25, 0.5, 1.0), "position fraction of each magnitude action (low, mid, high)"
    )
    half_spread_bps: float = _f(1.0, "half bid-ask spread paid by market orders, bps", lo=0.0)
    commission_bps: float = _f(1.0, "commission on traded notional, bps (all orders)", lo=0.0)
    limit_offsets: tuple[float, ...] = _f(
        (1.0, 0.5, 0.0),
        "limit depth k_u in sigma_hat units per urgency (low, mid, high): buy at close*(1-k*sigma)",
    )
    impact_eta: float = _f(
        0.0, "square-root impact coefficient eta (0 disables impact)", lo=0.0, hi=10.0
    )
    participation: float = _f(
        0.1, "participation rate u in eta*sigma*sqrt(traded/(u*ADV))", lo=1e-4, hi=1.0
    )
    adv_window: int = _f(20, "bars in the trailing average dollar volume (ADV)", lo=1)
    capital: float = _f(1.0e6, "account size in currency, sets traded/ADV for impact", lo=1.0)


@dataclass(frozen=True)
class ModelConfig:
    """Network sizes and component switches (M1-M14). Default: every component on."""

    bottleneck_dim: int = _f(
        128, "M1: linear bottleneck width used when the observation is wider (0: never)", lo=0
    )
    sh1: int = _f(128, "M1: first trunk layer width (seed: 512)", lo=1)
    sh2: int = _f(64, "M1: second trunk layer width (seed: 256)", lo=1)
    ah: int = _f(64, "M3: branch value/gate width (seed: 256)", lo=1)
    vsn_hidden: int = _f(32, "M2: hidden width R of the variable-selection gate MLP", lo=1)
    num_atoms: int = _f(51, "M6: C51 atoms per distribution", lo=2, hi=64)
    attention_heads: int = _f(2, "M9: heads of the cross-branch Q-attention", lo=1)
    denoise_steps: int = _f(2, "M11: residual denoiser steps K", lo=1)
    denoise_hidden: int = _f(32, "M11: hidden width of each denoiser step", lo=1)
    xlstm_hidden: int = _f(16, "M13: xLSTM memory width (context vector length)", lo=2)
    kan_grid_min: float = _f(-3.0, "M4: lower end of the spline grid (pre-activations clamped)")
    kan_grid_max: float = _f(3.0, "M4: upper end of the spline grid")
    vsn: bool = _f(True, "M2: sigmoid variable-selection mask")
    kan: bool = _f(True, "M4: KAN spline gate (off: GLU sigmoid gate)")
    dir_conditioning: bool = _f(True, "M5: magnitude branch sees E[Q_direction]/dz")
    q_centering: bool = _f(True, "M8: subtract the global Q mean before coordination")
    q_attention: bool = _f(True, "M9: cross-branch sigmoid-gated Q-attention")
    graph: bool = _f(True, "M10: dir->mag, dir->ord, mag->urg, ord->urg message passing")
    denoiser: bool = _f(True, "M11: residual diffusion denoiser over the 12 Q-values")
    selectivity: bool = _f(True, "M12: selectivity head (scales replay priorities)")
    xlstm: bool = _f(True, "M13: xLSTM context over per-branch batch statistics")
    liquid: bool = _f(True, "M14: liquid time constants scaling the spread term")
    kan_backend: str = _f(
        "auto",
        "M4: KAN gate implementation (auto: Pallas on GPU, jnp reference elsewhere)",
        choices=("auto", "pallas", "interpret", "reference"),
    )
    liquid_alpha_min: float = _f(
        0.01, "M14: Q-gap EMA rate when the gap moves as expected", lo=1e-6, hi=1.0
    )
    liquid_alpha_max: float = _f(
        0.5, "M14: Q-gap EMA rate approached under large relative surprise", lo=1e-6, hi=1.0
    )
    liquid_tau_min: float = _f(2.0, "M14: time constant of a stuck branch (updates)", lo=1e-3)
    liquid_tau_max: float = _f(50.0, "M14: time constant of a fast-learning branch", lo=1e-3)
    liquid_velocity_ref: float = _f(
        0.01, "M14: relative Q-gap velocity per update at which tau is ~76% of the way up", lo=1e-9
    )
    liquid_dt: float = _f(1.0, "M14: ODE time step per update", lo=1e-6)
    liquid_rk4_threshold: float = _f(
        1.0, "M14: RK4 instead of Euler when the xLSTM context norm exceeds this", lo=0.0
    )
    liquid_gap_mult: float = _f(10.0, "M14: target_gap = max(mult * eval_q_std_ema, floor)", lo=0.0)
    liquid_gap_floor: float = _f(0.3, "M14: floor of the spread amplifier's target gap", lo=0.0)
    liquid_max: float = _f(4.0, "M14: clip of the spread amplifier and of liquid_mod", lo=1e-3)


@dataclass(frozen=True)
class EvalConfig:
    """Deterministic evaluation walks and metrics (E3)."""

    periods_per_year: int = _f(252, "bars per year for annualisation", lo=1)
    key: int = _f(1234, "fixed PRNG seed of evaluation sampling (A1) and the random baseline")


@dataclass(frozen=True)
class BaselineConfig:
    """Parameters of the baseline strategies run through the same environment and costs."""

    momentum_lookback: int = _f(252, "bars of the sign-of-return momentum lookback", lo=2)
    macd_fast: int = _f(12, "MACD fast EMA span", lo=1)
    macd_slow: int = _f(26, "MACD slow EMA span", lo=2)
    macd_signal: int = _f(9, "MACD signal EMA span", lo=1)
    macd_mode: str = _f(
        "long_short",
        "MACD trend: short below the signal line, or flat there",
        choices=("long_short", "long_flat"),
    )
    vol_target: float = _f(0.10, "annualised volatility target of the vol-targeted long", lo=1e-3)


@dataclass(frozen=True)
class LearnerConfig:
    """The jitted iteration: acting, replay and learning (L1-L8, O1-O3, A1-A3)."""

    num_envs: int = _f(64, "E: environments acting in parallel (vmapped)", lo=1)
    act_steps: int = _f(8, "K: environment steps per iteration (acting scan)", lo=1)
    updates: int = _f(4, "U: learner updates per iteration (learner scan)", lo=1)
    batch_size: int = _f(128, "B: transitions per learner update", lo=2)
    replay_capacity: int = _f(32768, "replay capacity in transitions", lo=16)
    learning_starts: int = _f(1024, "transitions in replay before the first update", lo=1)
    gamma: float = _f(0.99, "discount per bar", lo=0.0, hi=1.0)
    reward_scale: float = _f(
        1.0,
        "learning rewards = reward_scale x log equity return (Q in those units; A1's tau floor "
        "of 0.01 is in them too)",
        lo=1e-6,
    )
    n_step: int = _f(3, "n of the n-step return (bootstrap with gamma^n)", lo=1, hi=64)
    lr: float = _f(
        3.0e-4, "O1/O2: base learning rate of the main Adam (trunk and branches)", lo=0.0
    )
    clip_norm: float = _f(10.0, "O1: global-norm gradient clip of the main Adam", lo=1e-6)
    aux_lr: float = _f(1.0e-4, "L6/O1: learning rate of the auxiliary Adam", lo=0.0)
    xlstm_lr: float = _f(1.0e-4, "L6/O1: learning rate of the xLSTM SGD", lo=0.0)
    target_update: str = _f("hard", "L2: target network update", choices=("hard", "polyak"))
    target_period: int = _f(200, "L2: updates between hard target copies", lo=1)
    polyak_tau: float = _f(0.005, "L2: Polyak rate of the soft target update", lo=0.0, hi=1.0)
    spread: bool = _f(True, "L3: spread surrogate on the action logits")
    spread_branch_scale: tuple[float, ...] = _f(
        (1.0, 0.5, 0.25, 0.25),
        "L3: per-branch spread weight (direction, magnitude, order, urgency)",
    )
    entropy: bool = _f(True, "L4: entropy bonus with the atom-utilisation ramp")
    entropy_base: float = _f(0.01, "L4: base entropy coefficient", lo=0.0)
    rank_rewards: bool = _f(True, "L5: rank-normalise batch rewards")
    aux_training: bool = _f(True, "L6: train denoiser, selectivity, coordination and xLSTM")
    adaptive_support: bool = _f(True, "L7: EMA-tracked support (off: fixed support)")
    support_half_width: float = _f(0.1, "L7: initial (or fixed) support half-width", lo=1e-6)
    support_alpha: float = _f(0.01, "L7: base EMA rate of the support", lo=0.0, hi=1.0)
    support_max_alpha: float = _f(0.5, "L7: EMA rate for abnormal shifts", lo=0.0, hi=1.0)
    projection_backend: str = _f(
        "reference",
        "L1/P1: C51 projection backend; the jnp scatter reference measured faster than the "
        "Pallas kernel on the H200 (bench/RESULTS.md)",
        choices=("auto", "pallas", "interpret", "reference"),
    )
    prioritised: bool = _f(True, "L8: prioritised replay (off: uniform sampling)")
    priority_alpha: float = _f(0.6, "L8: priority exponent", lo=0.0, hi=1.0)
    priority_beta0: float = _f(0.4, "L8: initial importance-sampling exponent", lo=0.0, hi=1.0)
    beta_anneal_updates: int = _f(20000, "L8: updates over which beta anneals to 1", lo=1)
    iqn_blend: bool = _f(True, "A2: act on Q90 blended toward Q10 by iqn_readiness (off: E[Q])")
    iqn_readiness: float = _f(0.0, "A2: initial readiness (host-set each epoch)", lo=0.0, hi=1.0)
    position_sizing: bool = _f(True, "A3: scale positions by 1/(1+sqrt(Var[Q]))")
    stats_alpha: float = _f(0.01, "EMA rate of reward std, utilisation and Q statistics", lo=0.0)


@dataclass(frozen=True)
class TrainConfig:
    """The host-side epoch loop (O2-O6, E3): schedule, plateau logic, checkpoints."""

    epochs: int = _f(30, "epochs to run", lo=1)
    iterations_per_epoch: int = _f(40, "jitted iterations per epoch", lo=1)
    sgdr_period: int = _f(20, "O2: epochs per cosine cycle T", lo=1)
    sgdr_floor: float = _f(0.1, "O2: cycle's final learning rate as a fraction of base", lo=0, hi=1)
    restart_moment_scale: float = _f(0.5, "O3: Adam mu/nu factor at each restart", lo=0, hi=1)
    iqn_readiness_epochs: int = _f(
        20, "A2: epochs over which iqn_readiness ramps linearly from its initial value to 1", lo=1
    )
    plateau_threshold: int = _f(4, "O5/O6: plateau epochs before the branch reset (O4)", lo=1)
    plateau_velocity_eps: float = _f(
        1e-4, "O5: |epoch change of the Q-gap EMA| below this counts as zero velocity", lo=0.0
    )
    plateau_sharpe_eps: float = _f(0.01, "O5: |change of val Sharpe| below this is a plateau", lo=0)
    rewind: bool = _f(True, "O6: restore the best checkpoint at plateau threshold + 3")
    branch_reset: bool = _f(True, "O4: reset branch Adam moments at the plateau threshold")
    keep_best: int = _f(3, "checkpoints kept by best val Sharpe", lo=1)
    keep_latest: int = _f(2, "most recent checkpoints kept", lo=1)
    max_faults: int = _f(3, "consecutive non-finite iterations before the run stops", lo=1)
    num_seeds: int = _f(1, "independent agents trained in one program (vmapped)", lo=1)


@dataclass(frozen=True)
class Config:
    """The whole run."""

    seed: int = _f(0, "run seed; every PRNG key is split from it")
    data: DataConfig = _sub(DataConfig, "data source and splits")
    features: FeatureConfig = _sub(FeatureConfig, "causal features and observation window")
    env: EnvConfig = _sub(EnvConfig, "market environment and costs")
    model: ModelConfig = _sub(ModelConfig, "network sizes and component switches")
    eval: EvalConfig = _sub(EvalConfig, "evaluation")
    baselines: BaselineConfig = _sub(BaselineConfig, "baseline strategies")
    learner: LearnerConfig = _sub(LearnerConfig, "the jitted training iteration")
    train: TrainConfig = _sub(TrainConfig, "the epoch loop, schedule, plateau logic, checkpoints")

    def __post_init__(self):
        _check_cross_fields(self)


#: Component switches (SPEC M and L/A groups). All of them off gives the plain branching
#: dueling C51 baseline of the ablations (prioritised replay, L8, stays as configured).
MODEL_SWITCHES = (
    "vsn",
    "kan",
    "dir_conditioning",
    "q_centering",
    "q_attention",
    "graph",
    "denoiser",
    "selectivity",
    "xlstm",
    "liquid",
)
LEARNER_SWITCHES = (
    "spread",
    "entropy",
    "rank_rewards",
    "aux_training",
    "adaptive_support",
    "iqn_blend",
    "position_sizing",
)
ALL_OFF = tuple(f"model.{k}=false" for k in MODEL_SWITCHES) + tuple(
    f"learner.{k}=false" for k in LEARNER_SWITCHES
)
"""Overrides that switch every component off (``load(path, [*ALL_OFF, ...])``)."""


def _check_cross_fields(cfg: Config) -> None:
    d, e, m, b = cfg.data, cfg.env, cfg.model, cfg.baselines
    if d.source in ("csv", "parquet") and not d.path:
        raise ConfigError(f"data.path: required when data.source is {d.source}")
    if d.split == "fraction" and d.train_frac + d.val_frac >= 1.0:
        raise ConfigError("data.val_frac: train_frac + val_frac must be < 1 (test needs bars)")
    if d.split == "date":
        for k in ("train_end", "val_end"):
            try:
                datetime.date.fromisoformat(getattr(d, k))
            except ValueError:
                raise ConfigError(
                    f"data.{k}: not an ISO date (YYYY-MM-DD): {getattr(d, k)!r}"
                ) from None
        if d.val_end <= d.train_end:
            raise ConfigError("data.val_end: must be after data.train_end")
    if len(e.magnitude_levels) != 3 or any(not 0 <= v <= 10 for v in e.magnitude_levels):
        raise ConfigError("env.magnitude_levels: need three values in [0, 10]")
    if len(e.limit_offsets) != 3 or any(v < 0 for v in e.limit_offsets):
        raise ConfigError("env.limit_offsets: need three non-negative values (low, mid, high)")
    if m.kan_grid_max <= m.kan_grid_min:
        raise ConfigError("model.kan_grid_max: must be greater than model.kan_grid_min")
    lr = cfg.learner
    if len(lr.spread_branch_scale) != 4:
        raise ConfigError("learner.spread_branch_scale: need four values")
    if lr.batch_size > lr.replay_capacity or lr.learning_starts > lr.replay_capacity:
        raise ConfigError("learner.replay_capacity: must hold batch_size and learning_starts")
    if lr.num_envs * lr.act_steps > lr.replay_capacity:
        raise ConfigError(
            "learner.replay_capacity: must hold one iteration's num_envs * act_steps transitions"
        )
    if b.macd_slow <= b.macd_fast:
        raise ConfigError("baselines.macd_slow: must be greater than baselines.macd_fast")


# ---------------------------------------------------------------------------------------------
# Loading, overrides, validation
# ---------------------------------------------------------------------------------------------

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _coerce(key: str, typ: Any, value: Any) -> Any:
    """Check ``value`` against the annotation ``typ`` and return it in canonical form."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, args[0], value)
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


def _build(cls, values: Mapping[str, Any], prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in values.items():
        key = prefix + str(name)
        if name not in fields:
            raise ConfigError(f"{key}: unknown config key")
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
            v = list(v)
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
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("\n...")
        rows.append((key, shown, help_))
    return rows


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
            v = list(v)
        text = yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...")
        lines.append(f"{pad}{f.name}: {text}")
    return "\n".join(lines)


DEFAULT_HEADER = (
    "# The embedded default (CPU-friendly, bundled S&P 500): identical to the dataclass defaults\n"
    "# in jaxdqn/config.py. Regenerate with: python -m jaxdqn.config > configs/default.yaml\n"
)

if __name__ == "__main__":
    print(DEFAULT_HEADER + commented_yaml())
