"""The config sections: one small frozen dataclass per concept.

========== ====================================================================================
section    what it configures
========== ====================================================================================
data       where the bars come from and how they are split (E2); ``data.synthetic``: the
           planted-signal market
features   causal features and the observation window (E2)
env        the vectorised market environment and its costs (E1)
model      network sizes and the M1–M13 component switches
acting     the acting half of the iteration: environments, steps, A1–A3
replay     prioritised replay and the learner's sample (L8)
optim      optimisers, updates per iteration and the learning-rate schedule (O1–O3)
loss       the learner's targets and losses (L1–L6) and the target network
dynamics   training statistics: EMAs, adaptive support (L7), M14 liquid time constants
kernels    which implementation runs each Pallas kernel (P1, P2)
eval       deterministic evaluation walks (E3)
baselines  parameters of the baseline strategies
train      the host-side epoch loop: epochs, plateau logic (O5, O6), checkpoints, seeds
========== ====================================================================================

Every field carries a one-line ``help`` (shown by ``--help``) and, where it applies,
``choices`` or bounds; :mod:`jaxdqn.config.loading` validates them. Checks that involve more
than one field live in :func:`check_cross_fields`, the only place they are made. The dataclass
defaults *are* the CPU-friendly embedded default (``configs/default.yaml`` mirrors them).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from jaxdqn.branches import NUM_BRANCHES

__all__ = [
    "ALL_OFF",
    "SWITCHES",
    "ActingConfig",
    "BaselineConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DynamicsConfig",
    "EnvConfig",
    "EvalConfig",
    "FeatureConfig",
    "KernelsConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "ReplayConfig",
    "SyntheticConfig",
    "TrainConfig",
    "check_cross_fields",
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


BACKENDS = ("auto", "pallas", "interpret", "reference")


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
    """Network sizes and component switches (M1–M13). Default: every component on."""

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


@dataclass(frozen=True)
class ActingConfig:
    """The acting half of the iteration (A1–A3): vectorised environments and their steps."""

    num_envs: int = _f(64, "E: environments acting in parallel (vmapped)", lo=1)
    steps: int = _f(8, "K: environment steps per iteration (acting scan)", lo=1)
    iqn_blend: bool = _f(True, "A2: act on Q90 blended toward Q10 by iqn_readiness (off: E[Q])")
    iqn_readiness: float = _f(0.0, "A2: initial readiness (host-set each epoch)", lo=0.0, hi=1.0)
    iqn_readiness_epochs: int = _f(
        20, "A2: epochs over which iqn_readiness ramps linearly from its initial value to 1", lo=1
    )
    position_sizing: bool = _f(True, "A3: scale positions by 1/(1+sqrt(Var[Q]))")


@dataclass(frozen=True)
class ReplayConfig:
    """Prioritised replay on device and the learner's sample from it (L8)."""

    capacity: int = _f(32768, "replay capacity in transitions", lo=16)
    learning_starts: int = _f(1024, "transitions in replay before the first update", lo=1)
    batch_size: int = _f(128, "B: transitions per learner update", lo=2)
    prioritised: bool = _f(True, "L8: prioritised replay (off: uniform sampling)")
    priority_alpha: float = _f(0.6, "L8: priority exponent", lo=0.0, hi=1.0)
    priority_beta0: float = _f(0.4, "L8: initial importance-sampling exponent", lo=0.0, hi=1.0)
    beta_anneal_updates: int = _f(20000, "L8: updates over which beta anneals to 1", lo=1)


@dataclass(frozen=True)
class OptimConfig:
    """Optimisers (O1), learner updates per iteration, and the SGDR schedule (O2, O3)."""

    updates: int = _f(4, "U: learner updates per iteration (learner scan)", lo=1)
    lr: float = _f(
        3.0e-4, "O1/O2: base learning rate of the main Adam (trunk and branches)", lo=0.0
    )
    clip_norm: float = _f(10.0, "O1: global-norm gradient clip of the main Adam", lo=1e-6)
    aux_lr: float = _f(1.0e-4, "L6/O1: learning rate of the auxiliary Adam", lo=0.0)
    xlstm_lr: float = _f(1.0e-4, "L6/O1: learning rate of the xLSTM SGD", lo=0.0)
    sgdr_period: int = _f(20, "O2: epochs per cosine cycle T", lo=1)
    sgdr_floor: float = _f(0.1, "O2: cycle's final learning rate as a fraction of base", lo=0, hi=1)
    restart_moment_scale: float = _f(0.5, "O3: Adam mu/nu factor at each restart", lo=0, hi=1)


@dataclass(frozen=True)
class LossConfig:
    """The learner's targets and losses (L1–L6) and the target network (L2)."""

    gamma: float = _f(0.99, "discount per bar", lo=0.0, hi=1.0)
    n_step: int = _f(3, "n of the n-step return (bootstrap with gamma^n)", lo=1, hi=64)
    reward_scale: float = _f(
        1.0,
        "learning rewards = reward_scale x log equity return (Q in those units; A1's tau floor "
        "of 0.01 is in them too)",
        lo=1e-6,
    )
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


@dataclass(frozen=True)
class DynamicsConfig:
    """Training statistics (one owner: ``jaxdqn.agent.dynamics``): EMAs, L7, M14."""

    stats_alpha: float = _f(0.01, "EMA rate of reward std, utilisation and Q statistics", lo=0.0)
    eval_q_std_alpha: float = _f(
        0.3, "M14: EMA rate of the validation Q spread (host-side, once per epoch)", lo=0.0, hi=1.0
    )
    adaptive_support: bool = _f(True, "L7: EMA-tracked support (off: fixed support)")
    support_half_width: float = _f(0.1, "L7: initial (or fixed) support half-width", lo=1e-6)
    support_alpha: float = _f(0.01, "L7: base EMA rate of the support", lo=0.0, hi=1.0)
    support_max_alpha: float = _f(0.5, "L7: EMA rate for abnormal shifts", lo=0.0, hi=1.0)
    liquid: bool = _f(True, "M14: liquid time constants scaling the spread term")
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
class KernelsConfig:
    """Which implementation runs each Pallas kernel (auto: Pallas on GPU, jnp elsewhere)."""

    projection: str = _f(
        "reference",
        "P1: C51 projection; the jnp scatter reference measured faster than the Pallas kernel "
        "on the H200 (bench/RESULTS.md)",
        choices=BACKENDS,
    )
    kan: str = _f("auto", "P2: KAN spline gate (M4)", choices=BACKENDS)


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
class TrainConfig:
    """The host-side epoch loop: epochs, plateau logic (O4–O6), checkpoints, seeds."""

    epochs: int = _f(30, "epochs to run", lo=1)
    iterations_per_epoch: int = _f(40, "jitted iterations per epoch", lo=1)
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
    acting: ActingConfig = _sub(ActingConfig, "acting: environments, steps, A1-A3")
    replay: ReplayConfig = _sub(ReplayConfig, "prioritised replay and the learner's sample")
    optim: OptimConfig = _sub(OptimConfig, "optimisers, updates per iteration, SGDR schedule")
    loss: LossConfig = _sub(LossConfig, "targets, losses and the target network")
    dynamics: DynamicsConfig = _sub(DynamicsConfig, "training statistics: EMAs, support, M14")
    kernels: KernelsConfig = _sub(KernelsConfig, "Pallas kernel implementations")
    eval: EvalConfig = _sub(EvalConfig, "evaluation")
    baselines: BaselineConfig = _sub(BaselineConfig, "baseline strategies")
    train: TrainConfig = _sub(TrainConfig, "the epoch loop, plateau logic, checkpoints")

    def __post_init__(self):
        check_cross_fields(self)


#: Component switches per section (SPEC M, L and A groups). All of them off gives the plain
#: branching dueling C51 baseline of the ablations (prioritised replay, L8, stays as configured).
SWITCHES: dict[str, tuple[str, ...]] = {
    "model": (
        "vsn",
        "kan",
        "dir_conditioning",
        "q_centering",
        "q_attention",
        "graph",
        "denoiser",
        "selectivity",
        "xlstm",
    ),
    "dynamics": ("liquid", "adaptive_support"),
    "loss": ("spread", "entropy", "rank_rewards", "aux_training"),
    "acting": ("iqn_blend", "position_sizing"),
}
ALL_OFF = tuple(f"{section}.{k}=false" for section, keys in SWITCHES.items() for k in keys)
"""Overrides that switch every component off (``load(path, [*ALL_OFF, ...])``)."""


def check_cross_fields(cfg: Config) -> None:
    """Every check that involves more than one field (raises :class:`ConfigError`)."""
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
    if len(cfg.loss.spread_branch_scale) != NUM_BRANCHES:
        raise ConfigError(f"loss.spread_branch_scale: need {NUM_BRANCHES} values")
    r, a = cfg.replay, cfg.acting
    if r.batch_size > r.capacity or r.learning_starts > r.capacity:
        raise ConfigError("replay.capacity: must hold replay.batch_size and replay.learning_starts")
    if a.num_envs * a.steps > r.capacity:
        raise ConfigError(
            "replay.capacity: must hold one iteration's acting.num_envs * acting.steps transitions"
        )
    y = cfg.dynamics
    if y.liquid_alpha_min > y.liquid_alpha_max:
        raise ConfigError("dynamics.liquid_alpha_min: must be <= dynamics.liquid_alpha_max")
    if y.liquid_tau_min > y.liquid_tau_max:
        raise ConfigError("dynamics.liquid_tau_min: must be <= dynamics.liquid_tau_max")
    if b.macd_slow <= b.macd_fast:
        raise ConfigError("baselines.macd_slow: must be greater than baselines.macd_fast")
