"""The config sections: one small frozen dataclass per concept.

============ ==================================================================================
section      what it configures
============ ==================================================================================
data         where the bars come from and how they are split (E2); ``data.synthetic``: the
             planted-signal market
features     causal features and the observation window (E2)
env          the vectorised market environment and its costs (E1)
model        network sizes and the M1–M13 component switches
acting       the acting half of the iteration: environments, steps, A1–A3
replay       prioritised replay and the learner's sample (L8)
optim        optimisers, updates per iteration and the learning-rate schedule (O1–O3)
loss         the learner's targets and losses (L1–L6) and the target network
dynamics     training statistics: EMAs, adaptive support (L7), M14 liquid time constants
kernels      which implementation runs each Pallas kernel (P1, P2)
eval         deterministic evaluation walks (E3), the statistics' bootstrap, the cost stress
baselines    parameters of the baseline strategies
train        the host-side epoch loop: epochs, plateau logic (O5, O6), checkpoints, seeds
walkforward  the folds of ``python -m jaxdqn.walkforward``: anchored or rolling, purge, embargo
============ ==================================================================================

Every field carries a one-line ``help`` (shown by ``--help``) and, where it applies,
``choices`` or bounds; :mod:`jaxdqn.config.loading` validates them. Checks that involve more
than one field live in :func:`check_cross_fields`, the only place they are made. The dataclass
defaults *are* the CPU-friendly embedded default (``configs/default.yaml`` mirrors them).
"""

from __future__ import annotations

import datetime
import itertools
import re
from dataclasses import dataclass

from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config.agent_sections import (
    ActingConfig,
    DynamicsConfig,
    KernelsConfig,
    LossConfig,
    OptimConfig,
    ReplayConfig,
)
from jaxdqn.config.data_sections import (
    DataConfig,
    SyntheticConfig,
    SyntheticInstrument,
    date_range,
)
from jaxdqn.config.fields import ConfigError, _f, _sub
from jaxdqn.config.population_sections import PopulationConfig

__all__ = [
    "ALL_OFF",
    "ALL_ON",
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
    "SyntheticInstrument",
    "TrainConfig",
    "WalkForwardConfig",
    "check_cross_fields",
]


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
    autocorr_span: int = _f(
        0,
        "EWMA span (bars) of the lag-1 return autocorrelation feature 'autocorr', kept in "
        "absolute units (not centred per instrument); 0: no such feature. Warmup grows to it",
        lo=0,
        hi=100_000,
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
    limit_through_bps: float = _f(
        5.0, "a limit fills only if bar t+1 trades through it by this many bps (not a touch)", lo=0
    )


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
class EvalConfig:
    """Deterministic evaluation walks and metrics (E3)."""

    policy: str = _f(
        "greedy",
        "policy of val, model selection, plateau detection, test and evaluate: greedy (argmax of "
        "E[Q] after M8-M11, A3 sizing kept) or boltzmann (the seed system: A2 blend + A1 sample)",
        choices=("greedy", "boltzmann"),
    )
    key: int = _f(1234, "fixed PRNG seed of evaluation sampling (A1) and the random baseline")
    bootstrap_reps: int = _f(
        1000,
        "stationary-bootstrap replications of every Sharpe confidence interval and SPA test",
        lo=10,
    )
    cost_multiples: tuple[float, ...] = _f(
        (0.0, 1.0, 2.0, 3.0),
        "cost stress: multiples of the configured costs the best checkpoint's test walk is "
        "repeated at (increasing, >= 0, must include 1: the test walk itself)",
    )
    select_on: str = _f(
        "mean",
        "panels: a walk's score (model selection, plateau detection, the epoch log) is the "
        "mean or the median over instruments of each instrument's metric",
        choices=("mean", "median"),
    )
    plots: bool = _f(
        True,
        "write the report's figures (PNG, about 1-2 s a run); false: report.md without them "
        "(configs/smoke.yaml, the tests' sizes, sets false)",
    )
    gate_t: float | None = _f(
        None,
        "panels: also report the validation-gated portfolio. Each agent trades on test only the "
        "instruments where its val walk's Sharpe is at least gate_t standard errors "
        "(metrics.sharpe_se over that instrument's val bars), equal-weighted among them, and "
        "holds the others flat (e.g. 1.0; chosen on val only: the ungated numbers are reported "
        "as before). null: no gate",
        lo=-10.0,
        hi=10.0,
    )
    walk_test: bool = _f(
        True,
        "walk the best checkpoint on test at the end of the run (and the baselines, the test "
        "statistics and the cost stress); a sweep's trials set false: test is walked only for "
        "the search's winner, after the search (python -m jaxdqn.sweep)",
    )


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
        0.01,
        "O5: a branch is frozen when its Q-gap EMA changed by less than this fraction of itself "
        "in an epoch",
        lo=0.0,
    )
    plateau_sharpe_eps: float = _f(
        0.1,
        "O5: |change of val Sharpe| below this many standard errors of the val Sharpe is a plateau",
        lo=0,
    )
    rewind: bool = _f(True, "O6: restore the best checkpoint at plateau threshold + 3")
    branch_reset: bool = _f(True, "O4: reset branch Adam moments at the plateau threshold")
    keep_best: int = _f(3, "checkpoints kept by best val Sharpe", lo=1)
    keep_latest: int = _f(2, "most recent checkpoints kept", lo=1)
    max_faults: int = _f(3, "consecutive non-finite iterations before the run stops", lo=1)
    num_seeds: int = _f(1, "independent agents trained in one program (vmapped)", lo=1)
    deterministic: bool = _f(
        True,
        "bit-identical reruns on the same hardware (same seed, config and compilation cache): "
        "on accelerators the C51 projection runs as the Triton pull kernel instead of "
        "scatter-adds (kernels.projection=auto; H200: 1,492 vs 1,438 us per learner update, "
        "3.7 %); the CPU is deterministic either way. On a GPU XLA's timing-based autotuning "
        "may pick other kernels at every fresh compilation; the compilation cache folder (on "
        "by default) keeps its compiled programs and its autotuning results, so reruns with "
        "it repeat bit for bit (--no-compile-cache gives that up); bench/RESULTS.md (issue 16)",
    )
    devices: int = _f(
        0,
        "devices the program uses: 0 = every device JAX sees (every local GPU; every process's "
        "under jax.distributed), N = the first N",
        lo=0,
    )
    mesh: str = _f(
        "auto",
        "how the devices are split: seed = the population's seeds over the devices (no "
        "communication), data = one agent data-parallel (environments, replay and batch split, "
        "gradients averaged), SEEDxDATA (e.g. 2x4), auto = seed gcd(num_seeds, devices) x the "
        "rest data; a run resumes on the same mesh shape",
    )


@dataclass(frozen=True)
class WalkForwardConfig:
    """Walk-forward folds (``python -m jaxdqn.walkforward``): fold k is train | purge | val |
    purge | test; the K test segments follow each other and the last ends at the last bar
    (:mod:`jaxdqn.market.folds` has the arithmetic)."""

    mode: str = _f(
        "anchored",
        "anchored: every fold trains from the first bar; rolling: on a window of `train` length",
        choices=("anchored", "rolling"),
    )
    unit: str = _f(
        "years",
        "unit of train/val/test: bars, or calendar years (whole months) counted back from the "
        "last bar",
        choices=("bars", "years"),
    )
    folds: int = _f(4, "number of folds, i.e. of consecutive out-of-sample test segments", lo=1)
    train: float = _f(0.0, "rolling: length of the train window (anchored: unused, 0)", lo=0.0)
    val: float = _f(1.0, "val length of every fold (model selection)", lo=0.0)
    test: float = _f(1.0, "test length of every fold (out of sample)", lo=0.0)
    purge: int = _f(5, "bars left out between train and val and between val and test", lo=0)
    embargo: int = _f(
        0,
        "rolling: the bars right after each test segment that no later fold trains on "
        "(de Prado's embargo; a window reaching them starts after them); anchored: must be 0",
        lo=0,
    )


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
    walkforward: WalkForwardConfig = _sub(
        WalkForwardConfig, "walk-forward folds (python -m jaxdqn.walkforward)"
    )
    population: PopulationConfig = _sub(
        PopulationConfig, "hyperparameter populations: members trained in one program"
    )

    def __post_init__(self):
        check_cross_fields(self)


#: Component switches per section (docs/DESIGN.md: the M, L and A components). All of them
#: off gives the plain branching dueling C51 baseline of the ablations (prioritised replay,
#: L8, stays as configured).
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
    "loss": ("sampled_target", "spread", "entropy", "rank_rewards", "aux_training"),
    "acting": ("iqn_blend", "position_sizing"),
}
ALL_OFF = tuple(f"{section}.{k}=false" for section, keys in SWITCHES.items() for k in keys)
"""Overrides that switch every component off (``load(path, [*ALL_OFF, ...])``)."""
ALL_ON = tuple(f"{section}.{k}=true" for section, keys in SWITCHES.items() for k in keys)
"""Overrides that switch every component on, including those off by default (L3)."""


def check_cross_fields(cfg: Config) -> None:
    """Every check that involves more than one field (raises :class:`ConfigError`)."""
    d, e, m, b = cfg.data, cfg.env, cfg.model, cfg.baselines
    if d.source in ("csv", "parquet") and not d.path:
        raise ConfigError(f"data.path: required when data.source is {d.source}")
    if d.symbol_column is not None and d.source not in ("csv", "parquet"):
        raise ConfigError("data.symbol_column: names a column of a csv or parquet data.path")
    _check_synthetic_panel(d.synthetic.panel)
    if 0 < cfg.features.autocorr_span < 10:
        raise ConfigError(
            f"features.autocorr_span: {cfg.features.autocorr_span} bars cannot estimate an "
            "autocorrelation; use 0 (off) or at least 10"
        )
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
    mesh = str(cfg.train.mesh).strip().lower()
    if mesh not in ("auto", "seed", "data") and not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", mesh):
        raise ConfigError(
            f"train.mesh: {cfg.train.mesh!r} is not auto, seed, data or SEEDxDATA (e.g. 2x4)"
        )
    r, a = cfg.replay, cfg.acting
    if r.batch_size > r.capacity or r.learning_starts > r.capacity:
        raise ConfigError("replay.capacity: must hold replay.batch_size and replay.learning_starts")
    if a.num_envs * a.steps > r.capacity:
        raise ConfigError(
            "replay.capacity: must hold one iteration's acting.num_envs * acting.steps transitions"
        )
    bpy = d.bars_per_year
    if isinstance(bpy, str) and bpy != "auto":
        raise ConfigError(f"data.bars_per_year: 'auto' or a positive number, got {bpy!r}")
    if not isinstance(bpy, str) and not 0 < bpy < float("inf"):
        raise ConfigError(f"data.bars_per_year: must be a positive number or auto, got {bpy!r}")
    rs = cfg.loss.reward_scale
    if isinstance(rs, str) and rs != "auto":
        raise ConfigError(f"loss.reward_scale: 'auto' or a positive number, got {rs!r}")
    if not isinstance(rs, str) and not 0 < rs < float("inf"):
        raise ConfigError(f"loss.reward_scale: must be a positive number or auto, got {rs!r}")
    y = cfg.dynamics
    if y.liquid_alpha_min > y.liquid_alpha_max:
        raise ConfigError("dynamics.liquid_alpha_min: must be <= dynamics.liquid_alpha_max")
    if y.liquid_tau_min > y.liquid_tau_max:
        raise ConfigError("dynamics.liquid_tau_min: must be <= dynamics.liquid_tau_max")
    if b.macd_slow <= b.macd_fast:
        raise ConfigError("baselines.macd_slow: must be greater than baselines.macd_fast")
    if d.split == "bars":
        _check_bar_ranges(d)
    if d.split == "dates":
        _check_date_ranges(d)
    _check_cost_multiples(cfg.eval.cost_multiples)
    _check_walkforward(cfg.walkforward)


def _check_synthetic_panel(panel: tuple[SyntheticInstrument, ...]) -> None:
    names = [inst.name.strip() for inst in panel]
    for i, name in enumerate(names):
        if not name:
            raise ConfigError(f"data.synthetic.panel[{i}].name: every instrument needs a name")
        if name in names[:i]:
            raise ConfigError(f"data.synthetic.panel[{i}].name: {name!r} again")
    if len(panel) == 1:
        raise ConfigError(
            "data.synthetic.panel: one instrument is the plain synthetic market; list two or more"
        )


def _check_bar_ranges(d: DataConfig) -> None:
    """split=bars: three ordered, non-overlapping [start, stop) ranges (gaps allowed)."""
    ranges = {"train_bars": d.train_bars, "val_bars": d.val_bars, "test_bars": d.test_bars}
    for k, r in ranges.items():
        if len(r) != 2 or not 0 <= r[0] < r[1]:
            raise ConfigError(
                f"data.{k}: split=bars needs [start, stop) with 0 <= start < stop, got {list(r)}"
            )
    if d.val_bars[0] < d.train_bars[1]:
        raise ConfigError("data.val_bars: must start at or after the end of data.train_bars")
    if d.test_bars[0] < d.val_bars[1]:
        raise ConfigError("data.test_bars: must start at or after the end of data.val_bars")


def _check_date_ranges(d: DataConfig) -> None:
    """split=dates: three ordered, non-overlapping [first, last] date ranges (gaps allowed)."""
    keys = ("train_dates", "val_dates", "test_dates")
    spans = [date_range(k, getattr(d, k)) for k in keys]
    for i in (1, 2):
        if spans[i][0] < spans[i - 1][1]:
            raise ConfigError(
                f"data.{keys[i]}: must start after the last date of data.{keys[i - 1]}"
            )


def _check_cost_multiples(multiples: tuple[float, ...]) -> None:
    if any(not 0 <= k < float("inf") for k in multiples) or 1.0 not in multiples:
        raise ConfigError(
            f"eval.cost_multiples: need numbers >= 0 that include 1, got {list(multiples)}"
        )
    if any(b <= a for a, b in itertools.pairwise(multiples)):
        raise ConfigError(f"eval.cost_multiples: must be increasing, got {list(multiples)}")


def _check_walkforward(w: WalkForwardConfig) -> None:
    lengths = {"val": w.val, "test": w.test}
    if w.mode == "rolling":
        lengths["train"] = w.train
    elif w.train != 0:
        raise ConfigError("walkforward.train: only rolling folds have a train window; set 0")
    for k, v in lengths.items():
        if v <= 0:
            raise ConfigError(f"walkforward.{k}: must be > 0 ({w.unit}), got {v}")
        if w.unit == "bars" and v != int(v):
            raise ConfigError(f"walkforward.{k}: a whole number of bars (unit=bars), got {v}")
        if w.unit == "years" and abs(12 * v - round(12 * v)) > 1e-9:
            raise ConfigError(f"walkforward.{k}: a whole number of months (unit=years), got {v}")
    if w.mode == "anchored" and w.embargo:
        raise ConfigError(
            "walkforward.embargo: anchored folds train from the first bar, over every earlier "
            "test segment; the embargo applies to rolling folds only (set 0)"
        )
